"""Where Horovod keeps its eager helper (``horovod.tensorflow.gradient_aggregation_eager``): Horo's
helper works eagerly and in graphs alike, see ``horo_tf.gradient_aggregation``."""
from horo_tf.gradient_aggregation import LocalGradientAggregationHelperEager

__all__ = ["LocalGradientAggregationHelperEager"]
