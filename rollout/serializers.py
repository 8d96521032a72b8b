from __future__ import annotations

from rest_framework import serializers

from claims.digest import digest
from claims.serializers import DigestField, JSONValueField, StrictSerializer, identifier, lease_seconds


class LegacyClaimIn(StrictSerializer):
    owner_id = identifier()
    ttl_seconds = lease_seconds()


class LegacyReleaseIn(StrictSerializer):
    owner_id = identifier()


class LegacyCompleteIn(StrictSerializer):
    owner_id = identifier()
    result = JSONValueField()
    result_digest = DigestField()

    def validate(self, attrs):
        if digest(attrs["result"]) != attrs["result_digest"]:
            raise serializers.ValidationError({"result_digest": ["Does not match the digest of result."]})
        return attrs
