"""BlockTables: the id view of the block tables, one growable array row per sequence."""
import numpy as np

from chorus.engine.block_tables import BlockTables


def test_extend_appends_and_get_reads_back():
    tables = BlockTables(num_rows=2, width=2)
    tables.extend("a", [3, 4])
    tables.extend("a", [5])
    assert tables.get("a") == [3, 4, 5] and tables.get("b") == [] and "a" in tables


def test_rows_and_width_grow_without_losing_tables():
    tables = BlockTables(num_rows=1, width=1)
    for i in range(5):
        tables.extend(f"s{i}", list(range(i, i + 3)))
    assert [tables.get(f"s{i}") for i in range(5)] == [list(range(i, i + 3)) for i in range(5)]


def test_gather_is_a_zero_padded_copy_in_the_order_asked():
    tables = BlockTables()
    tables.extend("long", [7, 8, 9])
    tables.extend("short", [4])
    ids, lengths = tables.gather(["short", "long"])
    assert ids.tolist() == [[4, 0, 0], [7, 8, 9]] and lengths.tolist() == [1, 3]
    tables.extend("short", [5])
    assert ids.tolist() == [[4, 0, 0], [7, 8, 9]]  # a snapshot


def test_a_removed_row_is_reused_clean():
    tables = BlockTables(num_rows=1)
    tables.extend("a", [1, 2, 3])
    tables.remove("a")
    tables.extend("b", [6])
    assert tables.get("a") == [] and tables.get("b") == [6]
    assert tables.gather(["b"])[0].tolist() == [[6]]
    assert np.count_nonzero(tables.ids) == 1


def test_gather_of_nothing_is_empty():
    ids, lengths = BlockTables().gather([])
    assert ids.shape == (0, 0) and lengths.shape == (0,)
