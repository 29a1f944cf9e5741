"""The one way memqual renders an HTML page: Jinja2 templates from
host/report/templates/ (package data, beside this module in a checkout and in a
wheel) with autoescape always on, and the shared style sheet
(templates/memqual.css) inlined, so that every page stays one
self-contained file with no external resource.

A page module builds its own typed view (frozen dataclasses of plain
values, nothing pre-escaped) and calls ``render``.  Escaping is the
templates' job alone: this module must not know any page's data, and no
caller should escape by hand what it passes in, or it shows escaped twice.
"""

from __future__ import annotations

import functools
from typing import Any

import jinja2
from markupsafe import Markup

TEMPLATES = "templates"
STYLESHEET = "memqual.css"


@functools.cache
def environment() -> jinja2.Environment:
    """The shared environment: loaded once, templates compiled once."""
    loader = jinja2.PackageLoader("memqual.host.report", TEMPLATES)
    env = jinja2.Environment(
        loader=loader,
        # Every template, whatever its name: a page of results files' text
        # must never take a string from them as markup.
        autoescape=True,
        # A misspelt field is an error, not an empty cell on a page.
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # Read as it is, not as a template: CSS braces are no Jinja syntax.
    source, _, _ = loader.get_source(env, STYLESHEET)
    env.globals["stylesheet"] = Markup(source)
    return env


def stylesheet() -> Markup:
    """The style sheet every page inlines in its <style>."""
    return Markup(environment().globals["stylesheet"])


def render(template: str, **context: Any) -> str:
    """A whole page (or a section of one) from ``template`` and its typed
    view."""
    return environment().get_template(template).render(**context)


def fragment(template: str, **context: Any) -> Markup:
    """A section rendered on its own, to be placed in another page as it is
    (already escaped once, by its template)."""
    return Markup(render(template, **context))
