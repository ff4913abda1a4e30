"""pytest rewrites the asserts of the support module the test files here share (its failures
show their values, as in a test file); it must be told before the module is imported."""

import pytest

pytest.register_assert_rewrite("sql_support")
