"""The Triton tests' shared runs (test_lambdas.py, test_histogram.py and test_aot.py, which were one
file, test_triton.py): the interpreted kernels once per session, read by test_lambdas.py and
test_histogram.py alike, and the first-contact sm_90 compiles once."""
import pytest

from kernels.triton import FIRST_CONTACT, INTERPRETED, ROOT, compile_named, interpreted_json


@pytest.fixture(scope="session")
def interpreted_kernels(tmp_path_factory):
    pytest.importorskip("triton")
    return interpreted_json(tmp_path_factory, INTERPRETED, ROOT)


@pytest.fixture(scope="session")
def first_contact(tmp_path_factory):
    pytest.importorskip("triton")
    return compile_named(tmp_path_factory, FIRST_CONTACT)
