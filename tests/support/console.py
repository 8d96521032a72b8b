"""Logging in to the console through Django's test client — with or without the rollout app installed."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client


def login(role: str) -> Client:
    user = get_user_model().objects.create_user(username=f"{role}-user", password="pw-123456")
    user.groups.set([Group.objects.get_or_create(name=role)[0]])
    client = Client()
    assert client.login(username=user.username, password="pw-123456")
    return client
