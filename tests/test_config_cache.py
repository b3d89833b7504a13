"""The tuning cache: where it lives, that invalid entries are skipped with a warning (where asked for and as the nearest
bucket), and that concurrent tuners keep each other's entries."""
import json
import math
import os
import subprocess
import sys
import warnings

import pytest
import torch

import lamixer
from lamixer.kernels.config import Config, default_config
from lamixer.tools.check import random_call
from lamixer.tuning import choose
from lamixer.tuning import config_cache as at


def write_entries(entries: dict) -> None:
    """The tuning cache file holding exactly these entries (key -> configuration list)."""
    path = at.cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"version": at.CACHE_VERSION, "entries": {k: {"config": v, "timings": {}} for k, v in entries.items()}}
    path.write_text(json.dumps(data))
    at._memo.clear()


def key_at(B, T, H, K=128, V=128) -> str:
    return at.entry_key("gpu", "abc", torch.bfloat16, at.shape_bucket(B, T, H, K, V))


GOOD = Config(64, 64, 32, 4, 2, 32, 0, 8).as_list()


def changed(index: int, value) -> list:
    return GOOD[:index] + [value] + GOOD[index + 1:]


BAD = {
    "BT = 0": changed(0, 0), "BT = 7": changed(0, 7), "BT = -64": changed(0, -64), "BT = 2^20": changed(0, 2**20), "BT = 128": changed(0, 128),
    "BV = 7": changed(1, 7), "BK = 512": changed(2, 512), "BW = 3": changed(5, 3), "BG = 8": changed(6, 8),
    "3 warps": changed(3, 3), "32 warps": changed(3, 32), "grad warps 5": changed(7, 5), "0 stages": changed(4, 0), "5 stages": changed(4, 5),
    "BT infinite": changed(0, math.inf), "BV nan": changed(1, math.nan), "BT 64.5": changed(0, 64.5), "BT a string": changed(0, "64"),
    "BT true": changed(0, True), "seven settings": GOOD[:7], "nine settings": GOOD + [1], "not a list": 64, "no config": None,
}  # fmt: skip


@pytest.mark.parametrize("bad", list(BAD.values()), ids=list(BAD))
def test_an_invalid_tuned_entry_is_ignored_with_a_warning(tuning_cache, bad):
    write_entries({key_at(4, 8192, 16): bad})
    with pytest.warns(UserWarning, match="ignoring the autotune entry"):
        assert at.lookup(key_at(4, 8192, 16)) is None


def test_an_invalid_entry_of_a_nearer_bucket_leaves_the_valid_one(tuning_cache):
    """nearest_key serves a shape from the nearest tuned bucket: an invalid entry there must not be it."""
    far = Config(32, 32, 32, 8, 1, 32, 0, 0)
    write_entries({key_at(1, 512, 1): far.as_list(), key_at(4, 8192, 16): changed(0, 0)})
    with pytest.warns(UserWarning, match="ignoring the autotune entry"):
        assert at.lookup(key_at(4, 16384, 16)) == far


def test_shipped_entries_are_valid():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        at._memo.clear()
        assert at._entries()


def test_a_call_survives_an_invalid_entry_for_its_shape(tuning_cache):
    """A training call on the chunk kernels, with an entry of 0-token chunks stored for exactly its kernels and shape."""
    m = lamixer.load("simple_gla")
    group = m.compiled.plan.groups[0]
    bucket = at.shape_bucket(1, 40, 2, 16, 16)
    write_entries({at.entry_key(at.device_name(torch.device("cpu")), h, torch.float32, bucket): changed(0, 0) for h in choose.entry_hashes(group)})
    tensors, _ = random_call(m, B=1, T=40, H=2, size=16, dtype=torch.float32, seed=1, initial_state=False, distinct=False)
    leaves = {k: v.requires_grad_() for k, v in tensors.items()}  # training: the chunk kernels
    with pytest.warns(UserWarning, match="ignoring the autotune entry"):
        o, _ = m(**leaves, backend="triton")
    o.sum().backward()
    assert choose.choose(group, torch.float32, 1, 40, 2, 16, 16, torch.device("cpu")) == default_config(group.decay.kind, 16, 16)
    ref, _ = m(**{k: v.detach() for k, v in tensors.items()}, backend="interpret")
    assert (o - ref).norm() / ref.norm() < 1e-5


def test_tuning_cache_honours_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv("LAMIXER_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert at.cache_file().parent == tmp_path / "xdg" / "lamixer"
    monkeypatch.setenv("LAMIXER_CACHE", str(tmp_path / "mine"))
    assert at.cache_file().parent == tmp_path / "mine"


def test_an_unwritable_tuning_cache_warns_instead_of_failing(tuning_cache, monkeypatch):
    monkeypatch.setenv("LAMIXER_CACHE", str(tuning_cache / "a file"))
    (tuning_cache / "a file").write_text("not a folder")
    with pytest.warns(UserWarning, match="could not store"):
        assert at.store(key_at(4, 8192, 16), Config(*GOOD), {}) is None


WRITER = """
import os, sys, time
import torch
from lamixer.kernels.config import Config
from lamixer.tuning import config_cache as at

me, n, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]
open(os.path.join(folder, "ready-" + me), "w").close()
while len([f for f in os.listdir(folder) if f.startswith("ready-")]) < 2:  # start together: the stores overlap
    time.sleep(0.01)
for i in range(n):
    at.store(at.entry_key("gpu", f"{me}{i}", torch.bfloat16, at.shape_bucket(1, 64, 1, 64, 64)), Config(64, 64, 64, 4, 2), {})
"""


def test_concurrent_tuners_keep_every_entry(tuning_cache):
    """Two processes storing 300 entries each into one cache: all 600 are there after (store locks the file around
    its read-modify-write)."""
    env = {**os.environ, "LAMIXER_CACHE": str(tuning_cache)}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, name, "300", str(tuning_cache)], env=env) for name in ("a", "b")]
    assert [w.wait(timeout=600) for w in writers] == [0, 0]
    entries = json.loads(at.cache_file().read_text())["entries"]
    assert len(entries) == 600


def test_every_setting_of_a_configuration_has_its_allowed_values():
    from dataclasses import fields

    assert list(at.ALLOWED) == [f.name for f in fields(Config)]
