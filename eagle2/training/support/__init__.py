"""What the pipeline's steps share, outside its flow: ``precision`` (the training autocast dtype), ``losses``
(the loss pieces every objective uses), ``models`` (trainable state, exports), ``warm_state`` (the committed
state a fresh clone resumes from), ``distributed`` (torchrun), and ``datastore`` (REST's datastores built
from the corpora's token shards)."""
