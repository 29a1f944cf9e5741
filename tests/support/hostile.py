"""A string a results file (or a lab host) may carry that a page must show
as text: escaped exactly once, never taken as markup, never escaped twice."""

from __future__ import annotations

HOSTILE = "m<script>x</script>&\"q'"
# What autoescape makes of it: what a reader's browser shows as HOSTILE.
ESCAPED = "m&lt;script&gt;x&lt;/script&gt;&amp;&#34;q&#39;"


def assert_escaped_once(page: str) -> None:
    assert ESCAPED in page
    assert "<script" not in page.lower()
    # Escaped twice, the browser would show "&lt;" or "&amp;" instead.
    for twice in ("&amp;lt;", "&amp;gt;", "&amp;amp;", "&amp;#"):
        assert twice not in page, twice
