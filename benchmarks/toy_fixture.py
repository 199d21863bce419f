"""Puts the tests' toy components (`tests/toy`, imported as `toy`) on the path of a benchmark that
runs them: `import toy_fixture` before `from toy import ...`."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
