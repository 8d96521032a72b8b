from __future__ import annotations

from django.contrib import admin

from claims.admin import ReadOnlyAdmin

from .models import FenceRequest

admin.site.register(FenceRequest, ReadOnlyAdmin)
