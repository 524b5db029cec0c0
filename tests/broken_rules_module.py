"""A rules module that fails as it loads (for the tests of code rules whose module is broken)."""

from __future__ import annotations

raise RuntimeError("this rules module is broken")
