"""Sphinx extension: the ``TASKLOOP`` settings reference, typed and defaulted from
``django_taskloop/conf.py`` at build time (see settings_reference).

- ``{taskloop-setting} KEY``: a ``confval`` whose body (Markdown) says what ``KEY`` does; its
  type and default are read from conf.py and cannot be written by hand. ``{confval}`KEY```
  links to it.
- ``{taskloop-settings}``: a table of every key of conf.py, with its type and default, each
  linking to its description.

The build warns (an error under ``-W``) of a key of conf.py that has no description, of a
description of a key conf.py does not have or with no body, and of a key whose check fits no
type, or several, of those the reference states.
"""

from __future__ import annotations

from typing import Any, ClassVar

import settings_reference as reference
from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.domains.std import ConfigurationValue
from sphinx.environment import BuildEnvironment
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)


def _field(name: str, *body: nodes.Node) -> nodes.field:
    return nodes.field("", nodes.field_name("", name), nodes.field_body("", nodes.paragraph("", "", *body)))


def _default(key: str) -> list[nodes.Node]:
    value, as_time = reference.default_parts(key)
    shown: list[nodes.Node] = [nodes.literal(value, value)]
    if as_time:
        shown.append(nodes.Text(f" ({as_time})"))
    return shown


class Setting(ConfigurationValue):
    """``{taskloop-setting} KEY``: one key of ``TASKLOOP``, described by the directive's body."""

    option_spec: ClassVar[dict[str, Any]] = {}
    has_content = True

    def run(self) -> list[nodes.Node]:
        key = self.arguments[0]
        if key not in reference.DEFAULTS:
            logger.warning(
                "TASKLOOP has no key %r (django_taskloop/conf.py, DEFAULTS): describe only keys it has",
                key,
                location=self.get_location(),
            )
            return []
        try:
            self.kind = reference.kind_of(key)
        except LookupError as error:
            logger.warning("%s", error, location=self.get_location())
            return []
        if not "".join(self.content).strip():
            logger.warning(
                "TASKLOOP[%r] is described by nothing: say what it does", key, location=self.get_location()
            )
        # A confval of Sphinx's standard domain: {confval} roles, the index and the page's
        # contents find it as they find any other.
        self.name = "std:confval"
        return super().run()

    def transform_content(self, content_node: addnodes.desc_content) -> None:
        key = self.arguments[0]
        fields = nodes.field_list(
            "", _field("Type", nodes.Text(self.kind.text)), _field("Default", *_default(key))
        )
        content_node.insert(0, fields)


class SettingsTable(SphinxDirective):
    """``{taskloop-settings}``: every key of ``TASKLOOP`` with its type and default."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        table = nodes.table(classes=["taskloop-settings"])
        group = nodes.tgroup(cols=3)
        table += group
        group.extend(nodes.colspec(colwidth=width) for width in (30, 40, 20))
        head = nodes.thead()
        head += self._row([nodes.Text("Key")], [nodes.Text("Type")], [nodes.Text("Default")])
        group += head
        body = nodes.tbody()
        for key in sorted(reference.DEFAULTS):
            try:
                kind = reference.kind_of(key).text
            except LookupError as error:
                logger.warning("%s", error, location=self.get_location())
                continue
            link = addnodes.pending_xref(
                "",
                nodes.literal(key, key),
                refdomain="std",
                reftype="confval",
                reftarget=key,
                refexplicit=True,
                refdoc=self.env.docname,
            )
            body += self._row([link], [nodes.Text(kind)], _default(key))
        group += body
        return [table]

    @staticmethod
    def _row(*cells: list[nodes.Node]) -> nodes.row:
        row = nodes.row()
        for cell in cells:
            row += nodes.entry("", nodes.paragraph("", "", *cell))
        return row


def _every_key_described(app: Sphinx, env: BuildEnvironment) -> None:
    described = {name for kind, name in env.get_domain("std").objects if kind == "confval"}
    for key in reference.DEFAULTS:
        if key not in described:
            logger.warning(
                "TASKLOOP[%r] (django_taskloop/conf.py) is not described: add a "
                "```{taskloop-setting} %s``` section to docs/settings.md",
                key,
                key,
                type="taskloop",
                subtype="settings",
            )


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("taskloop-setting", Setting)
    app.add_directive("taskloop-settings", SettingsTable)
    app.connect("env-check-consistency", _every_key_described)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
