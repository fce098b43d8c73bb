"""Every test gets its own user cache directory and its own working directory: the floor's figures (and anything
else cached per user) that one test measured are never what another test reads, no test writes into the real
~/.cache, and a command's default output (`results.csv` in the working directory) lands in the test's own folder,
never in the clone (tests that ran `save` in-process appended to the checkout's results.csv, where the next test
run's compare could read them). A module's or the session's fixtures run before any test's own directories are
set, so each scope gets its own as well (a module fixture's runs once read a floor that another module's fixture
had cached in ~/.cache, and a compare test saw an efficiency it did not expect)."""

import pytest


def _own(mp: pytest.MonkeyPatch, factory, name: str) -> None:
    mp.setenv("XDG_CACHE_HOME", str(factory.mktemp(f"xdg-cache-{name}")))
    mp.chdir(factory.mktemp(f"cwd-{name}"))


@pytest.fixture(scope="session", autouse=True)
def own_session_dirs(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        _own(mp, tmp_path_factory, "session")
        yield


@pytest.fixture(scope="module", autouse=True)
def own_module_dirs(own_session_dirs, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        _own(mp, tmp_path_factory, "module")
        yield


@pytest.fixture(autouse=True)
def own_test_dirs(own_module_dirs, tmp_path_factory, monkeypatch):
    _own(monkeypatch, tmp_path_factory, "test")


@pytest.fixture(scope="session")
def _box_floor_file(tmp_path_factory) -> str:
    """This box's ceilings (memory, copy, hashes, scan), measured once in the session, in a file of their own."""
    from ckptbench.system import floor as fl

    path = str(tmp_path_factory.mktemp("box-floor") / "floor.json")
    fl.measure(path=path)
    return path


@pytest.fixture
def box_floor(_box_floor_file, own_test_dirs) -> None:
    """For a test whose subject is not the floor but whose command measures it (`check`, `run` with no floor cached):
    the box's ceilings the session measured, in the test's own cache, so the command measures only its checkpoint's
    storage figure (the box's took 4-12 s a test). Measured on this box in this session, never planted or shared
    between tests as one test left them."""
    import os
    import shutil

    from ckptbench.system import floor as fl

    os.makedirs(os.path.dirname(fl.cache_path()), exist_ok=True)
    shutil.copyfile(_box_floor_file, fl.cache_path())
