"""The JSON renderer, with a last line of defence: an answer that holds text UTF-8 cannot encode (a lone surrogate
echoed from somewhere the parser does not see) is rendered with JSON's escapes instead of failing as a 500."""

from __future__ import annotations

import json

from rest_framework.renderers import JSONRenderer


class SafeJSONRenderer(JSONRenderer):
    def render(self, data, accepted_media_type=None, renderer_context=None):
        try:
            return super().render(data, accepted_media_type, renderer_context)
        except UnicodeEncodeError:
            return json.dumps(data, cls=self.encoder_class, ensure_ascii=True, allow_nan=False).encode(
                "ascii"
            )
