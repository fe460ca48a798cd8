"""Builds rankkit's one compiled piece, the CPU kernels (rankkit/kernels/_cpu.c: the tree;
rankkit/kernels/_lambdas.c: the lambda pass).

Everything else is declared in pyproject.toml. The extension is plain C called through ctypes
on raw pointers, so the build needs only a C compiler and Python's headers, not torch. It is
optional: without a compiler (or when the build fails) the install goes on and rankkit runs the
torch reference backend, which grows the same trees (slower). OpenMP is used when the compiler
has it (gcc, clang with libomp); otherwise the kernels run on one thread.
"""
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

_SOURCES = ["rankkit/kernels/_cpu.c", "rankkit/kernels/_lambdas.c"]


class BuildExt(build_ext):
    """Try with OpenMP, then without it; never fail the install (the torch path remains)."""

    def build_extension(self, ext):
        base_compile, base_link = list(ext.extra_compile_args), list(ext.extra_link_args)
        for omp in (True, False):
            ext.extra_compile_args = base_compile + (["-fopenmp"] if omp else [])
            ext.extra_link_args = base_link + (["-fopenmp"] if omp else [])
            try:
                return super().build_extension(ext)
            except Exception as e:  # noqa: BLE001 - a compiler error of any kind: try the next option
                reason = e
        self.warn(f"rankkit: the compiled CPU kernels were not built ({reason}); rankkit will use "
                  f"the torch backend (same trees, slower)")


setup(
    ext_modules=[Extension("rankkit.kernels._cpu", _SOURCES, define_macros=[("RANKKIT_PYTHON_MODULE", "1")],
                           # -fno-wrapv undoes the -fwrapv of Python's own CFLAGS: with it, gcc keeps
                           # the binning pass's search loop scalar (4x slower on 1.2M x 136); the C
                           # code relies on no signed wrap-around. -fno-trapping-math lets gcc
                           # vectorise the lambda pass's pair rows (their comparisons); it changes
                           # no value (nothing here traps floating-point exceptions), and
                           # -ffp-contract=off keeps every product and sum rounded as written.
                           extra_compile_args=["-O3", "-fno-wrapv", "-ffp-contract=off", "-fno-trapping-math"],
                           optional=True)],
    cmdclass={"build_ext": BuildExt},
)
