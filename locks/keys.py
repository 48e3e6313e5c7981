"""Lock names for views: fill a key template with encoded values, hash names that are too long."""

from __future__ import annotations

import hashlib
import string
from typing import Any
from urllib.parse import quote

from . import validation

#: What an encoded value consists of: letters, digits and "%" escapes. Everything else in a
#: key comes from the template, so a separator outside this set cannot occur in a value.
ENCODED = frozenset(string.ascii_letters + string.digits + "%")
#: Keys this long or longer are hashed; a hashed key is exactly MAX_NAME_LENGTH long, so it
#: never equals a key that was kept as it is.
HASHED_PREFIX = validation.MAX_NAME_LENGTH - 65


def encode_value(value: str) -> str:
    """Percent-encode every character of ``value`` except ASCII letters and digits.

    Example::

        encode_value("a:b/ü")  # -> 'a%3Ab%2F%C3%BC'
    """
    encoded = quote(value, safe="", errors="surrogatepass")
    # quote() leaves "-._~" alone; templates may use those as separators.
    return "".join(c if c in ENCODED else f"%{ord(c):02X}" for c in encoded)


def fit_name(name: str) -> str:
    """Return ``name``, or a readable prefix plus its SHA-256 when it is too long for a lock.

    Example::

        fit_name("report:" + "x" * 300)  # 'report:xxx...~a3673a16...' (255 characters)
    """
    if len(name) < validation.MAX_NAME_LENGTH:
        return name
    validation.check_long_name(name)
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()
    return f"{name[:HASHED_PREFIX]}~{digest}"


class _KeyFormatter(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        return encode_value(format(value, format_spec))


_formatter = _KeyFormatter()


def check_key_template(template: Any) -> str:
    """Return ``template`` if it can make collision-free lock names, else raise.

    Raises ``TypeError``/``ValueError`` for a non-string, empty or NUL-containing
    template, broken braces, nested fields, an unknown conversion (``!z``), automatic and
    numbered fields mixed (``{}`` with ``{0}``), a field that names no argument (``{.pk}``),
    or two fields not separated by a character other than a letter, digit or "%"
    (``"{a}{b}"`` would make "1"+"23" = "12"+"3").

    Example::

        check_key_template("invoice:{pk}")
    """
    if not isinstance(template, str):
        raise TypeError(f"lock_view key must be a str template or a callable, not {template!r}")
    if not template or "\x00" in template:
        raise ValueError(f"lock_view key template must be non-empty text without NUL: {template!r}")
    try:
        template.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"lock_view key template is not valid Unicode text: {template!r}") from exc
    previous: str | None = None
    numbering: set[bool] = set()  # whether fields count automatically ({}) or by position
    for literal, field, spec, conversion in _formatter.parse(template):
        # Refused here, not by format() at every request the view gets.
        if conversion not in (None, "r", "s", "a"):
            raise ValueError(f"lock_view key {template!r}: unknown conversion !{conversion}")
        # As lock_key's string.Formatter counts them: only a bare "{}" is automatic and a
        # bare "{0}" numbered ("{0.pk}" or "{0[1]}" with "{}" fills fine, unlike str.format).
        if field is not None and (field == "" or field.isdigit()):
            numbering.add(field == "")
            if len(numbering) == 2:
                raise ValueError(
                    f"lock_view key {template!r}: automatic ({{}}) and numbered ({{0}}) "
                    "fields cannot be mixed"
                )
        if field and field[0] in ".[":
            # string.Formatter looks "{.pk}" up as the keyword "", which no view gets.
            raise ValueError(
                f"lock_view key {template!r}: field {{{field}}} names no argument: write "
                f"{{0{field}}} or {{name{field}}}"
            )
        if previous is not None and field is not None and ENCODED.issuperset(literal):
            raise ValueError(
                f"lock_view key {template!r}: fields {{{previous}}} and {{{field or ''}}} "
                "must be separated by a character such as ':' or '/', or different values "
                "could make the same lock name"
            )
        if spec and "{" in spec:
            raise ValueError(f"lock_view key {template!r}: nested fields are not supported")
        previous = field
    return template


def lock_key(template: str, *args: Any, **kwargs: Any) -> str:
    """Fill a lock_view key template; each value is encoded so that keys never collide.

    Use it to name the lock a decorated view takes, e.g. to check it elsewhere. Fields
    come from ``kwargs`` (URL kwargs, and ``request``) and positional ``args``.

    Example::

        lock_key("invoice:{pk}", pk=42)          # 'invoice:42'
        lock_key("file:{path}", path="a/b:c")    # 'file:a%2Fb%3Ac'
        locks.is_locked(lock_key("invoice:{pk}", pk=42))
    """
    check_key_template(template)
    try:
        name = _formatter.vformat(template, args, kwargs)
    except (KeyError, IndexError, AttributeError) as exc:
        raise ValueError(
            f"lock_view key {template!r} needs {exc}, which the view did not get "
            f"(URL args: {len(args)}, URL kwargs: {sorted(k for k in kwargs if k != 'request')})"
        ) from exc
    return validation.check_name(fit_name(name))
