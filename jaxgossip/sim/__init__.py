"""The simulated world around a run: the clock of compute and network (``timing``), the price of
the bits a run sent on a network model (``cost``) and the device memory a run needs (``plan``)."""
