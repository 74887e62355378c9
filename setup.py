"""Build and install keras-adapt.

The C++ op library in ``csrc/`` is compiled against the TensorFlow that is
installed in the *current* environment, so install with
``pip install --no-build-isolation -e .`` after TensorFlow (``make setup``
does this). The library name carries the TensorFlow version
(``_keras_adapt_ops_tf2_21``) because an editable install shares one source
tree between environments with different TensorFlow versions and ABIs.
If TensorFlow is not importable at build time the library is skipped and
keras-adapt falls back to its pure-TensorFlow twin of every op.
"""

import glob
import os
import sys

from setuptools import find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.extension import Extension



def _op_extensions():
    try:
        import tensorflow as tf
    except ImportError:
        sys.stderr.write(
            "keras-adapt: TensorFlow is not importable at build time; the C++ "
            "ops are not built and the pure-TensorFlow twins will be used. "
            "Install TensorFlow first and build with --no-build-isolation.\n"
        )
        return []
    major, minor = tf.__version__.split(".")[:2]
    # The compile flags carry TensorFlow's include path and its C++ ABI
    # (-D_GLIBCXX_USE_CXX11_ABI=...); the link flags its framework library.
    compile_flags = [f for f in tf.sysconfig.get_compile_flags() if not f.startswith("--std")]
    return [
        Extension(
            f"keras_adapt.ops._keras_adapt_ops_tf{major}_{minor}",
            sources=sorted(glob.glob(os.path.join("csrc", "*.cc"))),
            language="c++",
            extra_compile_args=compile_flags + ["-std=c++17", "-O3", "-fvisibility=hidden"],
            extra_link_args=tf.sysconfig.get_link_flags(),
        )
    ]


class BuildOps(build_ext):
    """Builds the op library; a failure leaves the pure-TF twin in charge."""

    def build_extension(self, ext):
        # Python's own CFLAGS include -g, which the op library does not need,
        # and -fwrapv, which stops GCC from vectorising the kernel's loops
        # (the squared norms ran 3-4x slower with it: memory-bound at about
        # 16 GB/s without it, compute-bound with it).
        dropped = ("-g", "-Wstrict-prototypes", "-fwrapv")
        for attr in ("compiler_so", "compiler_cxx", "linker_so"):
            cmd = getattr(self.compiler, attr, None)
            if cmd:
                setattr(self.compiler, attr, [a for a in cmd if a not in dropped])
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - any compiler failure
            if os.environ.get("KERAS_ADAPT_REQUIRE_OPS") == "1":
                raise
            sys.stderr.write(
                f"keras-adapt: building the op library failed ({exc}); the "
                "pure-TensorFlow twins will be used.\n"
            )


# Metadata, dependencies, extras and entry points are in pyproject.toml; the
# packages and the op library (which needs the build-time TensorFlow) here.
setup(
    packages=find_packages(include=["keras_adapt", "keras_adapt.*"])
    + ["tensorboard_plugin_adapt"],
    # The TensorBoard plugin lives beside the library (plugins/) but installs
    # as its own top-level package, as TensorBoard's plugin examples do.
    package_dir={"tensorboard_plugin_adapt": "plugins/tensorboard_plugin_adapt"},
    # The patches `keras-adapt build-horovod` applies to Horovod's sdist.
    package_data={"tensorboard_plugin_adapt": ["static/*"],
                  "keras_adapt.horovod_build": ["patches/*.patch", "patches/README.md"]},
    ext_modules=_op_extensions(),
    cmdclass={"build_ext": BuildOps},
    zip_safe=False,
)
