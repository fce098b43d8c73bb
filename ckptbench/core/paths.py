"""Where the packaged data lies: the profiles (checkpoint shapes, storage presets) read by every layer."""

from __future__ import annotations

import os


def _profiles_dir() -> str:
    """Installed: ckptbench/profile_data inside the package (setup.py maps it); in a checkout: profiles/."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # ckptbench/
    installed = os.path.join(here, "profile_data")
    return installed if os.path.isdir(installed) else os.path.join(os.path.dirname(here), "profiles")


PROFILES_DIR = _profiles_dir()
