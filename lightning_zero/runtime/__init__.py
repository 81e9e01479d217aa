"""What a run needs around its strategy, for every backend: DeepSpeed's op builds (:mod:`~.ops`), the rank
watchdog (:mod:`~.watchdog`) and the helpers on batches and training steps (:mod:`~.batches`)."""
