"""asv: the Triton KV kernels per format (thin wrappers over kvbench.kernels.bench, which `kvbench
kernels` also uses). Without a CUDA GPU, setup raises NotImplementedError and asv records NaN."""

from kvbench.specs.formats import speed_kernels


def _gpu():
    import torch

    if not torch.cuda.is_available():
        raise NotImplementedError("the kernels benchmarks need a CUDA GPU (SM80+)")
    from kvbench.kernels import bench

    return bench, bench.AttnShape.from_model("llama-3.1-8b"), torch.device("cuda")


class DecodeAttention:
    """Paged decode attention, Llama-3.1-8B layer shape, batch 8."""

    version = "kvbench.kernels/1"
    params = (list(speed_kernels()), [4096, 32768])
    param_names = ["kv_format", "context"]
    timeout = 300

    def setup(self, fmt, context):
        bench, self.shape, dev = _gpu()
        from kvbench.kernels.decode_attention import decode_attention

        q, c, bt, sl = bench.decode_case(fmt, 8, context, self.shape, dev)
        ws: dict = {}
        self.fn = lambda: decode_attention(q, c, bt, sl, max_seq_len=context, workspace=ws)
        self.fn()  # compile outside the timing
        self.bench, self.dev = bench, dev

    def time_decode(self, fmt, context):
        self.fn()
        import torch

        torch.cuda.synchronize()

    def track_decode_gbs(self, fmt, context):
        return self.bench.bench_decode(fmt, 8, context, self.shape, self.dev)["gbs"]

    track_decode_gbs.unit = "GB/s"


class ReshapeAndCache:
    """Quantize + write new K/V tokens into the paged cache, Llama-3.1-8B layer shape."""

    version = "kvbench.kernels/1"
    params = (list(speed_kernels()), [8, 16384])
    param_names = ["kv_format", "tokens"]
    timeout = 300

    def setup(self, fmt, tokens):
        bench, self.shape, dev = _gpu()
        from kvbench.kernels.paged_cache import reshape_and_cache

        c, k, v, slots = bench.write_case(fmt, tokens, self.shape, dev)
        self.fn = lambda: reshape_and_cache(c, k, v, slots)
        self.fn()
        self.bench, self.dev = bench, dev

    def time_write(self, fmt, tokens):
        self.fn()
        import torch

        torch.cuda.synchronize()

    def track_write_gbs(self, fmt, tokens):
        return self.bench.bench_write(fmt, tokens, self.shape, self.dev)["gbs"]

    track_write_gbs.unit = "GB/s"
