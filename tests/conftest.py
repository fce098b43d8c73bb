"""Every test gets its own user cache directory: the floor's figures (and anything else cached per user) that one
test measured are never what another test reads, and no test writes into the real ~/.cache. A module's or the
session's fixtures run before any test's own directory is set, so each scope gets its own as well (a module fixture's
runs once read a floor that another module's fixture had cached in ~/.cache, and a compare test saw an efficiency
it did not expect)."""

import pytest


@pytest.fixture(scope="session", autouse=True)
def own_session_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache-session")))
        yield


@pytest.fixture(scope="module", autouse=True)
def own_module_cache(own_session_cache, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache-module")))
        yield


@pytest.fixture(autouse=True)
def own_user_cache(own_module_cache, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
