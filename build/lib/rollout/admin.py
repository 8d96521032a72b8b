from __future__ import annotations

from django.contrib import admin

from claims.admin import ReadOnlyAdmin

from . import models

for model in (
    models.LegacyClaim,
    models.Mismatch,
    models.ExplainRule,
    models.ComparedOperation,
    models.StageChange,
    models.GateEvaluation,
    models.DrainSnapshot,
    models.CoverageWaiver,
    models.Rollback,
    models.WorkerRegistration,
    models.LegacyEvent,
):
    admin.site.register(model, ReadOnlyAdmin)
