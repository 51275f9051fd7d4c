"""The double binary tree: shape checks for every node count up to 256, and NCCL's own pictures."""
from __future__ import annotations

import pytest

from hfr.dbtree import Node, parent_children, rooted_parent_children, rooted_tree, tree, tree_root

SIZES = range(1, 257)


def check_is_tree(nodes: list[Node], root: int) -> None:
    """One root (the given one), <= 2 children, parent and child links agree, and every node reaches the root."""
    n = len(nodes)
    assert [r for r, node in enumerate(nodes) if node.parent == -1] == [root]
    for r, node in enumerate(nodes):
        assert len(node.children) <= 2
        assert len(set(node.children)) == len(node.children)
        for c in node.children:
            assert 0 <= c < n and nodes[c].parent == r
        if node.parent != -1:
            assert 0 <= node.parent < n and r in nodes[node.parent].children
    for r in range(n):  # walking up ends at the root within n steps: spanning and acyclic
        steps = 0
        while r != root:
            r = nodes[r].parent
            steps += 1
            assert steps < n


def interior(nodes: list[Node]) -> set[int]:
    return {r for r, node in enumerate(nodes) if node.children}


@pytest.mark.parametrize("n", SIZES)
def test_both_trees_span_all_nodes(n):
    for which in (0, 1):
        check_is_tree(tree(n, which), tree_root(n, which))


@pytest.mark.parametrize("n", SIZES)
def test_interior_in_at_most_one_tree(n):
    shared = interior(tree(n, 0)) & interior(tree(n, 1))
    # For odd n, NCCL's shift leaves node 0 (tree 0's root) interior in tree 1 too.
    assert shared == ({0} if n % 2 == 1 and n > 1 else set())


def test_roots_as_nccl():
    assert [tree_root(n, 0) for n in (1, 2, 3, 12, 13)] == [0, 0, 0, 0, 0]
    assert [tree_root(n, 1) for n in (1, 2, 3, 12, 13)] == [0, 1, 1, 11, 1]


def test_nccl_pictures():
    """The trees drawn in NCCL's src/graph/trees.cc for 12 and 13 ranks."""
    t0 = tree(13, 0)
    assert t0[0] == Node(-1, (8,))
    assert t0[8] == Node(0, (4, 12))
    assert t0[4] == Node(8, (2, 6))
    assert t0[12] == Node(8, (10,))  # right child 14 is past the end, and so is 13: none
    assert t0[10] == Node(12, (9, 11))
    assert tree(14, 0)[12] == Node(8, (10, 13))  # the right child falls back to 12 + 1
    mirror = tree(12, 1)  # mirror: root 11, child 3, whose children are 1 and 7
    assert mirror[11] == Node(-1, (3,))
    assert mirror[3] == Node(11, (7, 1))
    assert mirror[7] == Node(3, (9, 5))
    shift = tree(13, 1)  # shift: root 1, child 9, whose children are 5 and 0
    assert shift[1] == Node(-1, (9,))
    assert shift[9] == Node(1, (5, 0))
    assert shift[0] == Node(9, (11,))


@pytest.mark.parametrize("n", range(1, 34))
def test_rooted_trees_for_every_root(n):
    for root in range(n):
        trees = [rooted_tree(n, which, root) for which in (0, 1)]
        for nodes in trees:
            check_is_tree(nodes, root)
        shared = interior(trees[0]) & interior(trees[1])
        assert shared == ({root} if n > 1 else set())


@pytest.mark.parametrize("n", [1, 2, 5, 8, 13])
def test_rooted_at_zero_tree0_is_tree0(n):
    assert rooted_tree(n, 0, 0) == tree(n, 0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="nnodes"):
        parent_children(0, 0, 0)
    with pytest.raises(ValueError, match="which"):
        parent_children(0, 4, 2)
    with pytest.raises(ValueError, match="node 4"):
        parent_children(4, 4, 0)
    with pytest.raises(ValueError, match="node -1"):
        rooted_parent_children(0, 4, 1, -1)
