"""The compressor interface shared by the framework adapters, and the compressor that sends tensors
as they are. Each adapter adds its own casting compressors (fp16, bf16) for its tensor type."""


class Compressor:
    """Interface: ``compress(tensor) -> (tensor, ctx)``, ``decompress(tensor, ctx) -> tensor``."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError("Compressor subclasses implement compress")

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError("Compressor subclasses implement decompress")


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor
