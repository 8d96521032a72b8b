from __future__ import annotations

from rest_framework.pagination import PageNumberPagination


class Pagination(PageNumberPagination):
    """DRF's `{count, next, previous, results}`; `?page=` and `?page_size=` (at most 500)."""

    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 500
