"""What a browser would post from a form of a page, read from the page's HTML."""

from __future__ import annotations

from collections.abc import Callable
from html.parser import HTMLParser


class _FormFields(HTMLParser):
    def __init__(self, form: Callable[[dict[str, str]], bool]) -> None:
        super().__init__()
        self.fields: dict[str, list[str]] = {}
        self._form = form
        self._inside = False
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = {key: value or "" for key, value in attrs}
        if tag == "form":
            self._inside = self._form(named)
        elif not self._inside or not named.get("name"):
            return
        elif tag == "input" and named.get("type") != "submit":
            self.fields.setdefault(named["name"], []).append(named.get("value", ""))
        elif tag == "textarea":
            self._textarea = named["name"]
            self.fields.setdefault(self._textarea, []).append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._inside = False
        elif tag == "textarea":
            self._textarea = None

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self.fields[self._textarea][-1] += data


def form_fields(
    html: str, form: Callable[[dict[str, str]], bool] = lambda attrs: True
) -> dict[str, list[str]]:
    """The values of the inputs and textareas (not the submit buttons) of the forms whose
    attributes ``form`` accepts, by name, in page order.

    Example::

        form_fields(page, lambda form: form.get("id") == "note_form")["version"]  # ["1"]
    """
    parser = _FormFields(form)
    parser.feed(html)
    return parser.fields
