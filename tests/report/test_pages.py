"""The pages' one Jinja2 environment: every template compiles, every page
inlines the one style sheet, a value is escaped once, a missing one is an
error rather than an empty cell."""

from __future__ import annotations

import jinja2
import pytest
from hostile import ESCAPED, HOSTILE, assert_escaped_once

from memqual.host.report import pages
from memqual.host.report.badges import badge, counts
from memqual.host.report.environment_line import EnvironmentLine

PAGES = ("report.html.j2", "comparison.html.j2", "history.html.j2", "fleet.html.j2", "bisect.html.j2")


def test_every_template_compiles() -> None:
    env = pages.environment()
    names = env.list_templates(extensions=["j2"])
    assert set(PAGES) <= set(names)
    for name in names:
        env.get_template(name)


@pytest.mark.parametrize("name", PAGES)
def test_every_page_extends_the_frame_that_inlines_the_style_sheet(name: str) -> None:
    env = pages.environment()
    assert env.loader is not None
    source, _, _ = env.loader.get_source(env, name)
    assert source.startswith('{% extends "base.html.j2" %}')
    assert "{{ stylesheet }}" in env.loader.get_source(env, "base.html.j2")[0]
    assert ".card{" in pages.stylesheet() and "td.odd{" in pages.stylesheet()


def test_a_missing_field_is_an_error_not_an_empty_cell() -> None:
    with pytest.raises(jinja2.UndefinedError):
        pages.render("history.html.j2", page=object())


def test_the_shared_macros_escape_once() -> None:
    # (A section rendered on its own and placed in a page, the balloon's, is
    # checked in test_report's hostile-name test.)
    env = pages.environment()
    macros = env.get_template("macros.html.j2").module
    badge_of, line_of, counts_of = (getattr(macros, name) for name in ("badge", "environment_line", "counts"))
    line = EnvironmentLine(HOSTILE, HOSTILE, (HOSTILE, HOSTILE))
    text = str(badge_of(badge(HOSTILE))) + str(line_of(line)) + str(counts_of(counts([HOSTILE], [HOSTILE])))
    assert_escaped_once(text)
    assert text.count(ESCAPED) == 6
    assert not line_of(EnvironmentLine()).strip()
