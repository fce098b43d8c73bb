"""The floor's cache can be written by anyone who can write the user's cache: a cached ceiling's method and the
cache's busy line are shown by `floor`, `floor --json` and `sysinfo`, redacted and bounded (a planted key or password
was printed as it was)."""

from __future__ import annotations

import pytest
import torch
from clirun import run_cli
from floorhelp import edit_cache
from safetensors.torch import save_file

from ckptbench.system import floor as fl
from ckptbench.system.floorcache import BUSY_MAX, METHOD_MAX

LEAK = " s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI@bucket/x password=hunter2 token=sEcReT"
SECRETS = ("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI", "hunter2", "sEcReT")


@pytest.fixture
def planted(tmp_path, plant_floor) -> str:
    """A checkpoint with this box's floor and its mount's storage figure planted, then every method and the busy
    line given credentials and a 100 kB tail, as a hand could."""
    ck = tmp_path / "ck"
    ck.mkdir()
    save_file({"w": torch.zeros(256, 256)}, str(ck / "model.safetensors"))
    plant_floor(source=ck, storage_gbps=2.0)

    def leak(doc: dict) -> None:
        for entry in [*doc["ceilings"].values(), *doc["storage"].values()]:
            entry["method"] += LEAK + " y" * 50_000
        doc["busy"] = "another job held the cores" + LEAK + " z" * 50_000

    edit_cache(leak)
    return str(ck)


def _clean(out: str) -> None:
    for secret in SECRETS:
        assert secret not in out
    assert "y y y" * 200 not in out and "z z z" * 200 not in out


@pytest.mark.parametrize("command", [["floor"], ["floor", "--json"], ["sysinfo"], ["sysinfo", "--json"]])
def test_a_planted_method_and_busy_line_are_shown_redacted_and_bounded(planted, command):
    r = run_cli(*command, planted)
    assert r.rc == 0 and "Traceback" not in r.err, r.err
    shown = r.out + r.err
    _clean(shown)
    if command != ["sysinfo"]:  # its text gives each figure's rate and age, not its method
        assert "planted by the test s3://bucket/x password=<redacted> token=<redacted>" in shown  # shown, not dropped
    if command[0] == "sysinfo":
        assert "another job held the cores s3://bucket/x password=<redacted>" in shown


def test_the_cache_as_loaded_holds_no_credential_and_no_long_line(planted):
    floor = fl.cached(fl.mount_key(__import__("ckptbench.sources", fromlist=["open_source"])
                                   .open_source(planted).describe()))
    assert floor is not None and floor.storage is not None
    for c in [*floor.ceilings.values(), floor.storage]:
        _clean(c.method)
        assert len(c.method) <= METHOD_MAX and "<redacted>" in c.method
    _clean(floor.busy)
    assert floor.busy.startswith("another job held the cores s3://bucket/x") and len(floor.busy) <= BUSY_MAX
