"""Page-number lists in DRF's shape (claim-v1.md §2: ``{count, next, previous, results}``), at a cost that does not
grow with the history (issue 13 item 7).

DRF's own paginator counts every matching row before it reads a page — a scan of every task ever committed for
``GET /tasks``. Here a page is read with one row more than it holds (that row says whether ``next`` exists), and
``count`` is exact up to ``API_LIST_COUNT_CAP`` (default 1,000): when the page itself shows where the list ends no
count query runs at all; otherwise the count stops at the cap plus one row. Past the cap, ``count`` is the cap and
the answer carries ``X-Count-Capped: true`` — ``next`` still leads on to every later page, and a page past the last
is still a 404. A page costs its offset (``page × page_size`` rows skipped), never the whole history.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.exceptions import NotFound
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param

CAPPED_HEADER = "X-Count-Capped"
MAX_OFFSET = (
    2**31
)  # a page number whose offset is beyond this is no page (the fuzzer sent 10**20: a 500 before)


class Pagination(PageNumberPagination):
    """DRF's `{count, next, previous, results}`; `?page=` and `?page_size=` (at most 500)."""

    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 500

    def paginate_queryset(self, queryset: Any, request: Any, view: Any = None) -> list[Any]:
        self.request = request
        size = self.get_page_size(request) or self.page_size
        raw = request.query_params.get(self.page_query_param, "1")
        try:
            number = int(raw)
        except (TypeError, ValueError):
            number = 0
        offset = (number - 1) * size
        if number < 1 or offset > MAX_OFFSET:  # past any real list, and past what the database's OFFSET takes
            raise NotFound("Invalid page.")
        rows = list(queryset[offset : offset + size + 1])
        self.number, self.has_next = number, len(rows) > size
        rows = rows[:size]
        if number > 1 and not rows:
            raise NotFound("Invalid page.")
        cap = settings.API_LIST_COUNT_CAP
        if not self.has_next:
            self.count, self.capped = offset + len(rows), False  # the page shows where the list ends
        else:
            # at most cap + 1 rows, and of each only its key: annotations the filter does not use are not computed
            bounded = queryset.order_by().values("pk")[: cap + 1].count()
            self.count, self.capped = min(bounded, cap), bounded > cap
        return rows

    def get_next_link(self) -> str | None:
        if not self.has_next:
            return None
        return self._link(self.number + 1)

    def get_previous_link(self) -> str | None:
        if self.number <= 1:
            return None
        return self._link(self.number - 1)

    def _link(self, number: int) -> str:
        assert self.request is not None
        url = self.request.build_absolute_uri()
        if number == 1:
            return remove_query_param(url, self.page_query_param)
        return replace_query_param(url, self.page_query_param, number)

    def get_paginated_response(self, data: Any) -> Response:
        response = Response(
            {
                "count": self.count,
                "next": self.get_next_link(),
                "previous": self.get_previous_link(),
                "results": data,
            }
        )
        if self.capped:
            response[CAPPED_HEADER] = "true"
        return response
