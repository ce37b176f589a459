"""The format names the kernels and the accuracy study take, in a module without torch or Triton, so the CLI
can check a flag without importing either."""

KERNEL_FORMATS = ("fp16", "bf16", "fp8", "fp8_e5m2", "nvfp4")  # what the Triton cache kernels write and read
ACCURACY_FORMATS = ("fp16", "bf16", "fp8", "fp8_e5m2", "nvfp4", "nvfp4_4over6", "mxfp4")  # the accuracy study
