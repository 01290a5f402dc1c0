"""FindItem restrictions and sort orders (types.xsd ``SearchExpressionType``) over stored items.

Supported: ``And``, ``Or``, ``Not``, ``Exists``, ``Contains`` and the six comparisons
(``IsEqualTo`` ... ``IsLessThanOrEqualTo``) against a ``t:Constant`` on the fields listed in
``FIELD_VALUES``. Anything else is answered ``ErrorUnsupportedPathForQuery`` as Exchange does for
properties it cannot search. Wire sample::

    <t:IsGreaterThanOrEqualTo>
      <t:FieldURI FieldURI="item:DateTimeReceived"/>
      <t:FieldURIOrConstant><t:Constant Value="2026-11-29T16:00:00Z"/></t:FieldURIOrConstant>
    </t:IsGreaterThanOrEqualTo>
"""

from __future__ import annotations

import operator
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

from .mailbox import Item
from .soap import ResponseError, SoapFault, parse_ews_datetime, t

FIELD_VALUES: dict[str, Callable[[Item], Any]] = {
    "item:DateTimeReceived": lambda i: i.received,
    "item:DateTimeCreated": lambda i: i.received,
    "item:DateTimeSent": lambda i: i.sent,
    "item:Subject": lambda i: i.subject,
    "item:Size": lambda i: i.size,
    "item:HasAttachments": lambda i: None,
    "item:InReplyTo": lambda i: None,
    "item:Categories": lambda i: None,
    "message:InternetMessageId": lambda i: i.internet_message_id,
    "message:IsRead": lambda i: i.is_read,
    "message:From": lambda i: i.sender[1] if i.sender else None,
    "message:Sender": lambda i: i.sender[1] if i.sender else None,
    "message:ToRecipients": lambda i: None,
    "message:References": lambda i: None,
}

_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "IsEqualTo": operator.eq,
    "IsNotEqualTo": operator.ne,
    "IsGreaterThan": operator.gt,
    "IsGreaterThanOrEqualTo": operator.ge,
    "IsLessThan": operator.lt,
    "IsLessThanOrEqualTo": operator.le,
}


def _field(expr: ET.Element) -> tuple[str, Callable[[Item], Any]]:
    uri_elem = expr.find(t("FieldURI"))
    uri = uri_elem.get("FieldURI", "") if uri_elem is not None else ""
    getter = FIELD_VALUES.get(uri)
    if getter is None:
        raise ResponseError(
            "ErrorUnsupportedPathForQuery", f"The property {uri!r} can't be searched."
        )
    return uri, getter


def _constant(uri: str, text: str) -> Any:
    if uri.startswith("item:DateTime"):
        return parse_ews_datetime(text)
    if uri == "item:Size":
        return int(text)
    if uri == "message:IsRead":
        return text.lower() == "true"
    return text


def evaluate(expr: ET.Element, item: Item) -> bool:
    local = expr.tag.rsplit("}", 1)[-1]
    if local == "And":
        return all(evaluate(e, item) for e in expr)
    if local == "Or":
        return any(evaluate(e, item) for e in expr)
    if local == "Not":
        return not evaluate(expr[0], item)
    if local == "Exists":
        return _field(expr)[1](item) is not None
    if local == "Contains":
        uri, getter = _field(expr)
        value, wanted = getter(item), expr.find(t("Constant"))
        if value is None or wanted is None:
            return False
        needle = wanted.get("Value", "")
        if expr.get("ContainmentComparison", "Exact") != "Exact":
            value, needle = str(value).lower(), needle.lower()
        return needle in str(value)
    compare = _COMPARISONS.get(local)
    if compare is None:
        raise SoapFault("ErrorSchemaValidation", f"Unsupported search expression {local}")
    uri, getter = _field(expr)
    constant = expr.find(f"{t('FieldURIOrConstant')}/{t('Constant')}")
    if constant is None:
        raise SoapFault("ErrorSchemaValidation", f"{local} needs a FieldURIOrConstant/Constant")
    value = getter(item)
    if value is None:
        return False
    return bool(compare(value, _constant(uri, constant.get("Value", ""))))


def sort_items(items: list[Item], order: ET.Element | None) -> None:
    """Sort in place by a ``m:SortOrder``; without one, Exchange's default view is newest first."""
    if order is None or len(order) == 0:
        items.sort(key=lambda i: i.received, reverse=True)
        return
    # Stable sorts applied from the last FieldOrder to the first give the multi-key order.
    for field_order in reversed(list(order)):
        getter = _field(field_order)[1]
        present = [i for i in items if getter(i) is not None]
        absent = [i for i in items if getter(i) is None]
        present.sort(key=getter, reverse=field_order.get("Order", "Ascending") == "Descending")
        items[:] = present + absent
