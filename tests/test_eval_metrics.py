"""Gold ranks, Recall@k and nDCG@10 against rankings worked out by hand, ties included."""

from __future__ import annotations

import numpy as np
import pytest

from faste_mm.datasets import gold_ranks, retention, score_ranks
from faste_mm.errors import InputError

QUERY = np.array([[1.0, 0.0]], dtype=np.float32)  # score = first component, exactly
# candidate:        0 (.6)      1 (1.0)     2 (.8)      3 (0)       4 (.6, ties with 0)
CANDIDATES = np.array([[0.6, 0.8], [1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]], dtype=np.float32)


@pytest.mark.parametrize(
    "candidate_list, expected_rank",
    [
        ((0, 1, 2, 3, 4), 2),  # order 1, 2, then the tie 0/4: the gold (listed first) precedes 4
        ((4, 0, 3), 0),  # gold 4 ties with 0 for the top: the gold wins the tie
        ((3, 1, 2), 2),  # gold scores lowest
        ((1, 0, 2), 0),  # gold scores highest
        ((0, 4, 4, 0), 0),  # all equal (duplicated candidates): the gold is first
    ],
)
def test_gold_rank_matches_hand_ranking_and_the_gold_wins_ties(candidate_list, expected_rank):
    assert gold_ranks(QUERY, CANDIDATES, [candidate_list]).tolist() == [expected_rank]


def test_each_query_is_ranked_against_its_own_list_only():
    queries = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    # Query 1 scores the second component: candidate 3 (1.0) > 0 (.8) > 2 (.6) > 1 (0).
    ranks = gold_ranks(queries, CANDIDATES, [(2, 1, 0), (0, 3, 2, 1)])
    assert ranks.tolist() == [1, 1]


def test_recall_and_ndcg_from_ranks_by_hand():
    scores = score_ranks(np.array([2, 0, 2, 11]))
    assert scores.recall_at_1 == 0.25
    assert scores.recall_at_5 == 0.75
    assert scores.recall_at_10 == 0.75
    # nDCG@10 with one gold: 1/log2(rank+2) inside the top 10: (1/2 + 1 + 1/2 + 0) / 4
    assert scores.ndcg_at_10 == pytest.approx(0.5)


def test_rank_9_is_a_hit_at_10_and_rank_10_is_not():
    assert score_ranks(np.array([9])).recall_at_10 == 1.0
    assert score_ranks(np.array([10])).recall_at_10 == 0.0
    assert score_ranks(np.array([9])).ndcg_at_10 == pytest.approx(1 / np.log2(11))


def test_twelve_candidates_gold_last_misses_recall_at_10():
    candidates = np.array([[1.0 - 0.01 * k, 0.0] for k in range(12)][::-1], dtype=np.float32)  # gold = lowest
    ranks = gold_ranks(QUERY, candidates, [tuple(range(12))])
    assert ranks.tolist() == [11]
    assert score_ranks(ranks).to_dict() == {"recall@1": 0.0, "recall@5": 0.0, "recall@10": 0.0, "ndcg@10": 0.0}


def test_retention_is_a_ratio_and_undefined_against_a_zero_full_score():
    assert retention(0.9, 0.9) == 1.0
    assert retention(0.45, 0.9) == 0.5
    assert retention(0.3, 0.0) is None


def test_mismatched_query_and_list_counts_raise_input_error():
    with pytest.raises(InputError, match="2 query vectors but 1 candidate lists"):
        gold_ranks(np.zeros((2, 2), np.float32), CANDIDATES, [(0, 1)])
