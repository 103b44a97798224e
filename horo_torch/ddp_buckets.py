"""Gradient buckets of ``DistributedDataParallel`` (horo_torch/ddp.py): which parameters share one
flat buffer and one allreduce.

DDP's bucketing (Li et al., VLDB 2020): gradients are reduced in buckets of at most a cap, so that
each allreduce is large enough to use the links well, and the first bucket is small, so that
communication starts while most of backward still runs. Buckets are filled in the order gradients
are expected to become ready; parameters of different dtypes or devices never share a bucket.
"""
MIB = 1024 * 1024
FIRST_BUCKET_BYTES = MIB


def assign_buckets(params, order, bucket_cap_bytes, first_bucket_bytes=FIRST_BUCKET_BYTES):
    """Groups parameters into buckets, filling them in the given order.

    Parameters of different dtypes or devices never share a bucket. A bucket is closed as soon as it
    holds at least its limit: ``min(first_bucket_bytes, bucket_cap_bytes)`` for the first bucket of
    each (dtype, device), ``bucket_cap_bytes`` after that. Buckets are returned in the order of their
    first parameter in ``order``.

    Args:
        params: the parameters (tensors), indexed by the entries of order.
        order: a permutation of ``range(len(params))``.
        bucket_cap_bytes: the size limit of a bucket in bytes.
        first_bucket_bytes: the limit of the first bucket of each (dtype, device).
    Returns:
        A list of buckets, each a list of parameter indices.
    """
    position = {index: pos for pos, index in enumerate(order)}
    open_buckets, closed_count, buckets = {}, {}, []
    for index in order:
        p = params[index]
        key = (p.device, p.dtype)
        indices, size = open_buckets.get(key, ([], 0))
        indices.append(index)
        size += p.numel() * p.element_size()
        limit = bucket_cap_bytes if closed_count.get(key, 0) else min(first_bucket_bytes, bucket_cap_bytes)
        if size >= limit:
            buckets.append(indices)
            closed_count[key] = closed_count.get(key, 0) + 1
            open_buckets.pop(key, None)
        else:
            open_buckets[key] = (indices, size)
    buckets.extend(indices for indices, _ in open_buckets.values())
    return sorted(buckets, key=lambda b: position[b[0]])


class Bucket:
    """The parameters of one bucket and the name its collective carries; a sparse bucket holds the
    one parameter of an Embedding(sparse=True), whose gradient is reduced as a sparse tensor."""

    __slots__ = ("indices", "params", "name", "sparse")

    def __init__(self, indices, params, name, sparse=False):
        self.indices, self.params, self.name, self.sparse = indices, params, name, sparse
