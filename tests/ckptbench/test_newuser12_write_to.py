"""`floor --write-to` a pseudo-filesystem: procfs reports no blocks at all, and the write figure said "0 MiB free,
... free some space", advice no one could take. It says what the directory is and where to point instead."""

from __future__ import annotations

import pytest

from ckptbench.core.errors import CkptbenchError
from ckptbench.system import writefloor


def test_a_filesystem_with_no_blocks_is_named_not_told_to_free_space():
    with pytest.raises(CkptbenchError) as e:
        writefloor.write_ceiling("/proc")
    line = str(e.value)
    assert "\n" not in line and line.startswith("/proc: ") and "holds no blocks" in line, line
    assert "free some space" not in line and "--write-to" in line, line
