"""Django admin for the raw records. Append-only records (the timeline, the audit log, the effect history) are
read-only here, like everywhere: they are written only by the services, in the transaction of what they record."""

from __future__ import annotations

from django.contrib import admin

from . import models


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(models.TaskEvent)
class TaskEventAdmin(ReadOnlyAdmin):
    list_display = ("id", "at", "kind", "task_id", "owner_id", "point", "via")
    list_filter = ("kind", "point", "via")
    search_fields = ("task__task_id", "owner_id")


@admin.register(models.AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("id", "at", "principal", "role", "action", "namespace", "target")
    list_filter = ("action", "role")


@admin.register(models.EffectEvent)
class EffectEventAdmin(ReadOnlyAdmin):
    list_display = ("id", "at", "effect_id", "kind", "from_state", "to_state", "principal")


# Records the services own: visible, never edited by hand (an edit here would skip every check).
for model in (
    models.Namespace,
    models.Task,
    models.Attempt,
    models.StagedResult,
    models.Effect,
    models.DispatchIntent,
    models.ResourceKey,
    models.Resource,
    models.Principal,
):
    admin.site.register(model, ReadOnlyAdmin)


@admin.register(models.Token)
class TokenAdmin(ReadOnlyAdmin):
    list_display = ("principal", "prefix", "created_at", "revoked_at")
    exclude = ("key_hash",)
