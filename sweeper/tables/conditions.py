"""The conditions of a read (`where`, as in TableStore.read_arrow) and the aggregates of `aggregate_arrow`, checked
and applied the same way by both engines."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame


def check_aggregates(aggregates: Sequence[tuple[str, str]], known: frozenset[str]) -> None:
    unknown = sorted({fn for _, fn in aggregates} - known)
    if unknown or not aggregates:
        raise ValueError(f"aggregate_arrow: unknown functions {unknown} (known: {sorted(known)})" if unknown
                         else "aggregate_arrow: no aggregates")


def is_value_list(value: Any) -> bool:
    """Whether a `read_arrow` condition is a choice of values rather than one value."""
    return isinstance(value, list | tuple | set | frozenset)


def filtered(df: DataFrame, where: Mapping[str, Any] | None) -> DataFrame:
    """`df`'s rows matching `where` (as in TableStore.read_arrow) as a Spark filter."""
    from pyspark.sql import functions as F

    for column, value in (where or {}).items():
        df = df.where(F.col(column).isin(list(value)) if is_value_list(value) else F.col(column) == value)
    return df
