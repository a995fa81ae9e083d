"""terra_core/path_masks.py: link bits, path masks and the full-link mask (hand-computed)."""

from terra_core.path_masks import IndexCache, PathIndex, full_mask, index_for, mark_full

CAP = {("A", "B"): 10.0, ("B", "C"): 10.0, ("A", "C"): 10.0}
PATHS = {("A", "C"): [("A", "C"), ("A", "B", "C")], ("A", "D"): [("A", "D")]}


def test_masks_follow_the_capacity_order():
    index = PathIndex(CAP)
    # bits: A-B = 0, B-C = 1, A-C = 2. Direct path A,C: 1 << 2 = 4; via B: 1 + 2 = 3.
    assert index.entries(("A", "C"), PATHS) == [(4, (2,)), (3, (0, 1))]
    # a link missing from the index (A-D) gets the extra bit 1 << 3 = 8 and index -1
    assert index.entries(("A", "D"), PATHS) == [(8, (-1,))]


def test_full_mask_and_its_incremental_update():
    index = PathIndex(CAP)
    avail = {("A", "B"): 10.0, ("B", "C"): 1e-6, ("A", "C"): 5.0}
    # B-C has 1e-6 of 10 left: at most 1e-6 x 10 = 1e-5, so full (bit 1); plus the missing bit 8
    assert full_mask(index, avail, CAP, 1e-6) == 2 | 8
    avail[("A", "C")] = 0.0
    mask = mark_full(2 | 8, index, [0, 2], avail, CAP, 1e-6)
    assert mask == 2 | 4 | 8  # A-C (bit 2) is full now, A-B (bit 0) is not
    direct, via_b = index.entries(("A", "C"), PATHS)
    assert direct[0] & mask and via_b[0] & mask  # both paths blocked


def test_index_is_kept_in_the_memo_while_the_links_stay():
    cache = IndexCache()
    first = index_for(cache, CAP)
    assert index_for(cache, dict(CAP)) is first
    assert index_for(cache, {**CAP, ("C", "A"): 1.0}) is not first
    assert index_for(None, CAP) is not first
