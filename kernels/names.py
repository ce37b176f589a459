"""The format names the kernels and the accuracy study take, in a module without torch or Triton, so the CLI
can check a flag without importing either."""

from kvbench.specs.formats import kernel_formats

# From the KV-dtype registry (formats.toml: `cache_kernel`, `accuracy_study`), in its precision order.
KERNEL_FORMATS = kernel_formats("cache_kernel")  # what the Triton cache kernels write and read
ACCURACY_FORMATS = kernel_formats("accuracy_study")  # the accuracy study
