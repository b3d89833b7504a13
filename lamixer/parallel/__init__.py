"""Context parallelism: a sequence split along its time axis over the ranks of a torch.distributed process group.

    o_local, final = mixer(q_local, k_local, v_local, g_local, initial_state=h0, output_final_state=True,
                           context_parallel=group)

Each rank holds a contiguous slice of the time axis, in rank order. Every scan is linear in its
initial state, S_end = A(S_0) + B, so a rank runs its slice from a zero state, the ranks exchange
(A, B) (a state's size, whatever the length), and each composes those of the ranks before it into
its own incoming state, whose effect on its outputs it then adds (lamixer/parallel/mixer.py).

- `shard.py`: where each rank's slice lies (lengths, packed sequences crossing ranks), agreement on
  a call's arguments before any collective, the previous rank's last tokens (halos);
- `collective.py`: the differentiable collectives (custom autograd Functions around torch.distributed),
  their backward passes issued in the same order on every rank;
- `mixer.py`: scans composed across ranks, whole-input statistics and block attention over the group;
- `slicing.py`: a mixer or layer call bound to one rank's slice.

docs/context_parallel.md describes the API and the algorithm.
"""
