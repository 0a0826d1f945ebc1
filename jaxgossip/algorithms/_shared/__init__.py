"""Pieces the algorithm modules share that are not algorithms themselves (private to
:mod:`jaxgossip.algorithms`: only its own modules import them; what other rooms need is
re-exported by :mod:`jaxgossip.algorithms` under a public name).

* :mod:`~jaxgossip.algorithms._shared.common`: hyperparameter checks, round counters, leaf-wise sums;
* :mod:`~jaxgossip.algorithms._shared.messages`: the received-models view of model-gossip
  (``Received``, the round of an algorithm whose messages are its models);
* :mod:`~jaxgossip.algorithms._shared.pair_tables`: oriented node pairs and the per-pair slot tables
  of edge-wise algorithms (PowerGossip), the symmetry check;
* :mod:`~jaxgossip.algorithms._shared.tree_tables`: the directed-edge tables of a tree, the tree
  check and the relay round of RelaySum.
"""
