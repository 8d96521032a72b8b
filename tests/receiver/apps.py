from __future__ import annotations

from django.apps import AppConfig


class ReceiverConfig(AppConfig):
    name = "tests.receiver"
    label = "receiver"
