"""Text data split by source: python_docs and .txt folders as next-token windows, the held-out part of
every source, the by_source partitioner, node shards of [M, T] targets."""

import numpy as np
import pytest

from jaxgossip import data


def _corpus(lengths, seed=0):
    rng = np.random.default_rng(seed)
    tokens = tuple(rng.integers(0, 256, size=n).astype(np.int32) for n in lengths)
    return data.TextCorpus(tuple(f"s{i}" for i in range(len(lengths))), tokens, 256, "toy", "toy corpus")


def test_python_docs_is_the_cpython_topics_as_bytes():
    from pydoc_data import topics

    corpus = data.python_docs_corpus()
    assert corpus.names == tuple(sorted(topics.topics))
    assert len(corpus.names) >= 70  # 79 on Python 3.11
    for name, tokens in zip(corpus.names, corpus.tokens):
        assert bytes(tokens.astype(np.uint8)).decode("utf-8") == topics.topics[name]
    assert sum(t.size for t in corpus.tokens) > 300_000


def test_windows_are_next_token_pairs_from_each_source_with_a_disjoint_held_out_tail():
    lengths = [300, 1000, 30, 131]
    corpus = _corpus(lengths)
    context, fraction = 16, 0.2
    ds = data.next_token_windows(corpus, context, test_fraction=fraction, seed=3)
    assert ds.x_train.shape[1:] == ds.y_train.shape[1:] == (context,)
    assert ds.x_train.dtype == np.int32 and ds.num_classes == 256
    np.testing.assert_array_equal(ds.x_train[:, 1:], ds.y_train[:, :-1])
    np.testing.assert_array_equal(ds.x_test[:, 1:], ds.y_test[:, :-1])
    # NumPy reference of the split, source by source; the 30-token source (< 2 * 17) is left out.
    kept = [i for i, n in enumerate(lengths) if n - max(int(np.ceil(fraction * n)), context + 1) >= context + 1]
    assert kept == [0, 1, 3] and "1 too short for a training and a held-out window left out" in ds.source
    train_ref, test_ref, groups_ref = [], [], []
    for g, i in enumerate(kept):
        t = corpus.tokens[i]
        held = max(int(np.ceil(fraction * t.size)), context + 1)
        head, tail = t[: t.size - held], t[t.size - held :]
        for start in range(0, head.size - context, context):
            train_ref.append(head[start : start + context + 1])
            groups_ref.append(g)
        for start in range(0, tail.size - context, context):
            test_ref.append(tail[start : start + context + 1])
    train_ref, test_ref = np.stack(train_ref), np.stack(test_ref)
    np.testing.assert_array_equal(np.concatenate([ds.x_train, ds.y_train[:, -1:]], 1), train_ref)
    np.testing.assert_array_equal(ds.groups, groups_ref)
    # Held-out windows are shuffled, the same ones as the reference, and every kept source has some.
    got = {tuple(w) for w in np.concatenate([ds.x_test, ds.y_test[:, -1:]], 1)}
    assert got == {tuple(w) for w in test_ref} and len(got) == len(test_ref)
    # Same seed, same data set.
    again = data.next_token_windows(corpus, context, test_fraction=fraction, seed=3)
    np.testing.assert_array_equal(again.x_test, ds.x_test)


def test_stride_overlaps_training_windows():
    corpus = _corpus([200])
    ds = data.next_token_windows(corpus, 8, stride=2, test_fraction=0.25)
    np.testing.assert_array_equal(ds.x_train[1, :-2], ds.x_train[0, 2:])


def test_context_larger_than_the_data_allows_names_the_largest_context():
    corpus = _corpus([100, 61])
    with pytest.raises(ValueError, match=r"context=60 is larger than toy allows.*context <= 49"):
        data.next_token_windows(corpus, 60)
    with pytest.raises(ValueError, match="context=0"):
        data.next_token_windows(corpus, 0)
    with pytest.raises(ValueError, match="test_fraction"):
        data.next_token_windows(corpus, 4, test_fraction=1.0)


def test_text_folder_one_source_per_file(tmp_path):
    (tmp_path / "b.txt").write_text("second source " * 20, encoding="utf-8")
    (tmp_path / "a.txt").write_text("first source, é " * 30, encoding="utf-8")
    (tmp_path / "skip.md").write_text("not a source")
    corpus = data.text_files_corpus(tmp_path)
    assert corpus.names == ("a", "b")
    assert bytes(corpus.tokens[0].astype(np.uint8)).decode() == "first source, é " * 30
    ds = data.load_dataset(f"text:{tmp_path}", context=16)
    assert set(np.unique(ds.groups)) == {0, 1}
    single = data.load_dataset(f"text:{tmp_path / 'b.txt'}", context=16)
    assert set(np.unique(single.groups)) == {0}
    with pytest.raises(data.DatasetNotFoundError, match="no such file"):
        data.load_dataset(f"text:{tmp_path / 'none'}")
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="not UTF-8"):
        data.text_files_corpus(tmp_path)


def test_by_source_gives_whole_sources_balanced_and_covers_the_data():
    ds = data.load_dataset("python_docs", context=32)
    labels, num_sources = data.partition_labels(ds)
    assert labels is ds.groups or np.array_equal(labels, ds.groups)
    for n in (4, 8):
        parts = data.partition(labels, n, "by_source", seed=1)
        together = np.sort(np.concatenate(parts))
        np.testing.assert_array_equal(together, np.arange(labels.size))
        hist = data.label_histograms(labels, parts, num_sources)
        assert (np.count_nonzero(hist, axis=0) == 1).all()  # every source on exactly one node
        sizes = np.array([p.size for p in parts])
        largest = np.bincount(labels).max()
        assert sizes.max() - sizes.min() <= largest  # greedy balance: within one source
    with pytest.raises(ValueError, match="by_source: 3 sources cannot give each of num_nodes=4"):
        data.partition(np.array([0, 0, 1, 2, 2]), 4, "by_source")
    with pytest.raises(ValueError, match="takes no parameter"):
        data.partition(labels, 4, "by_source:2")


def test_iid_and_dirichlet_over_sources():
    ds = data.load_dataset("python_docs", context=32)
    labels, num_sources = data.partition_labels(ds)
    iid = data.label_histograms(labels, data.partition(labels, 4, "iid"), num_sources)
    skewed = data.label_histograms(labels, data.partition(labels, 4, "dirichlet:0.1"), num_sources)
    # IID spreads most sources over every node; a small alpha concentrates each source on few nodes.
    assert np.count_nonzero(iid, axis=0).mean() > np.count_nonzero(skewed, axis=0).mean()


def test_node_shards_hold_sequence_targets():
    ds = data.load_dataset("python_docs", context=16)
    labels, _ = data.partition_labels(ds)
    parts = data.partition(labels, 4, "by_source")
    shards = data.shard_dataset(ds, parts)
    assert shards.x.shape[2:] == shards.y.shape[2:] == (16,)
    i = int(np.argmin(np.asarray(shards.counts)))
    count = int(shards.counts[i])
    np.testing.assert_array_equal(np.asarray(shards.y[i, :count]), ds.y_train[parts[i]])
    assert (np.asarray(shards.y[i, count:]) == -1).all()
