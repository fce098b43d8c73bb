"""Every test gets its own user cache directory: the floor's figures (and anything else cached per user) that one
test measured are never what another test reads, and no test writes into the real ~/.cache."""

import pytest


@pytest.fixture(autouse=True)
def own_user_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
