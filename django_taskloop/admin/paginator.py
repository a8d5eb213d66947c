"""A paginator that never counts a whole table: change lists stay fast at millions of rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property

from .. import engine

__all__ = ["EstimatedCountPaginator", "estimated_row_count"]


def estimated_row_count(model: Any, using: str) -> int | None:
    """Return the table statistics' row count of ``model`` on ``using``, or ``None`` if unknown
    (SQLite keeps none worth reading: its lists are counted, capped, instead)."""
    return engine.estimated_row_count(model._meta.db_table, using)


if TYPE_CHECKING:
    PaginatorBase = Paginator[Any]  # generic in django-stubs only
else:
    PaginatorBase = Paginator


class EstimatedCountPaginator(PaginatorBase):
    """Count at most ``exact_limit`` rows; beyond that, estimate or say "more than".

    An unfiltered list of a big table takes the row count from the table statistics
    (PostgreSQL ``pg_class.reltuples``, MySQL/MariaDB ``information_schema``): counting a
    million rows costs a full index scan on every page view. A filtered list is counted
    through ``LIMIT exact_limit + 1``, so that the count stops early. ``count_is_exact`` tells
    the template whether to say "about" or "more than".
    """

    exact_limit = 1_000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.count_is_exact = True
        self.count_is_estimate = False

    @cached_property
    def count(self) -> int:
        object_list = self.object_list
        if not isinstance(object_list, QuerySet):
            return len(object_list)
        capped = object_list.order_by()[: self.exact_limit + 1].count()
        if capped <= self.exact_limit:
            return capped
        self.count_is_exact = False
        if not object_list.query.where:
            estimate = estimated_row_count(object_list.model, object_list.db)
            # Statistics lag behind: never claim fewer rows than we have just seen.
            if estimate is not None and estimate > self.exact_limit:
                self.count_is_estimate = True
                return estimate
        return capped

    def validate_number(self, number: Any) -> int:
        # Beyond the counted rows the last page is unknown: let people page on (an empty page
        # then says so) instead of refusing pages that do exist.
        if self.count_is_exact:
            return super().validate_number(number)
        try:
            return max(1, int(number))
        except (TypeError, ValueError):
            return super().validate_number(number)

    def page(self, number: Any) -> Any:
        if self.count < 0 or self.count_is_exact:
            return super().page(number)
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        return Page(self.object_list[bottom : bottom + self.per_page], number, self)
