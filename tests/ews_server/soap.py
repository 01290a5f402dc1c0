"""SOAP 1.1 envelopes and EWS response messages, shaped after Microsoft's published schema.

Element names and order follow ``messages.xsd`` / ``types.xsd`` of Exchange Server 2016
(``RequestServerVersion`` Exchange2016; the server reports ``Version="V2017_07_11"`` exactly as a
2016 CU does). A success message as the server writes it::

    <s:Envelope xmlns:s="http://schemas.xmlsoap.org/soap/envelope/">
      <s:Header>
        <t:ServerVersionInfo MajorVersion="15" MinorVersion="1" MajorBuildNumber="2507"
                             MinorBuildNumber="6" Version="V2017_07_11"/>
      </s:Header>
      <s:Body>
        <m:GetFolderResponse>
          <m:ResponseMessages>
            <m:GetFolderResponseMessage ResponseClass="Success">
              <m:ResponseCode>NoError</m:ResponseCode>
              <m:Folders>...</m:Folders>
            </m:GetFolderResponseMessage>
          </m:ResponseMessages>
        </m:GetFolderResponse>
      </s:Body>
    </s:Envelope>

An error message carries ``ResponseClass="Error"``, ``MessageText``, ``ResponseCode`` and
``DescriptiveLinkKey`` in that order. Request-level failures are SOAP faults (HTTP 500) with the
EWS code in ``detail/e:ResponseCode``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime

SOAP_NS = "http://schemas.xmlsoap.org/soap/envelope/"
M_NS = "http://schemas.microsoft.com/exchange/services/2006/messages"
T_NS = "http://schemas.microsoft.com/exchange/services/2006/types"
E_NS = "http://schemas.microsoft.com/exchange/services/2006/errors"

for _prefix, _uri in (("s", SOAP_NS), ("m", M_NS), ("t", T_NS), ("e", E_NS)):
    ET.register_namespace(_prefix, _uri)

# Exchange Server 2016 CU23; exchangelib maps build 15.1 to API version "Exchange2016".
SERVER_BUILD = (15, 1, 2507, 6)
SERVER_VERSION_STRING = "V2017_07_11"


def s(tag: str) -> str:
    return f"{{{SOAP_NS}}}{tag}"


def m(tag: str) -> str:
    return f"{{{M_NS}}}{tag}"


def t(tag: str) -> str:
    return f"{{{T_NS}}}{tag}"


class SoapFault(Exception):
    """A request-level failure, answered as a SOAP fault with HTTP 500."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(f"{code}: {text}")
        self.code = code
        self.text = text


class ResponseError(Exception):
    """A per-message failure, answered as ``ResponseClass="Error"`` inside a normal response."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(f"{code}: {text}")
        self.code = code
        self.text = text


def ews_datetime(value: datetime) -> str:
    """``xs:dateTime`` in UTC with a ``Z`` suffix, whole seconds, as Exchange writes it."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_ews_datetime(text: str) -> datetime:
    value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def child(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    elem = ET.SubElement(parent, tag, attrs)
    if text is not None:
        elem.text = text
    return elem


def envelope(*body_children: ET.Element) -> bytes:
    env = ET.Element(s("Envelope"))
    header = child(env, s("Header"))
    major, minor, major_build, minor_build = SERVER_BUILD
    child(
        header,
        t("ServerVersionInfo"),
        MajorVersion=str(major),
        MinorVersion=str(minor),
        MajorBuildNumber=str(major_build),
        MinorBuildNumber=str(minor_build),
        Version=SERVER_VERSION_STRING,
    )
    body = child(env, s("Body"))
    body.extend(body_children)
    return bytes(ET.tostring(env, encoding="utf-8", xml_declaration=True))


def fault_envelope(code: str, text: str) -> bytes:
    """A SOAP fault as Exchange returns it for schema and request-level errors."""
    env = ET.Element(s("Envelope"))
    body = child(env, s("Body"))
    fault = child(body, s("Fault"))
    child(fault, "faultcode", f"t:{code}")
    child(fault, "faultstring", text)
    detail = child(fault, "detail")
    child(detail, f"{{{E_NS}}}ResponseCode", code)
    child(detail, f"{{{E_NS}}}Message", text)
    return bytes(ET.tostring(env, encoding="utf-8", xml_declaration=True))


def operation_response(operation: str, messages: list[ET.Element]) -> ET.Element:
    response = ET.Element(m(f"{operation}Response"))
    container = child(response, m("ResponseMessages"))
    container.extend(messages)
    return response


def success_message(operation: str) -> ET.Element:
    message = ET.Element(m(f"{operation}ResponseMessage"), {"ResponseClass": "Success"})
    child(message, m("ResponseCode"), "NoError")
    return message


def error_message(operation: str, code: str, text: str) -> ET.Element:
    message = ET.Element(m(f"{operation}ResponseMessage"), {"ResponseClass": "Error"})
    child(message, m("MessageText"), text)
    child(message, m("ResponseCode"), code)
    child(message, m("DescriptiveLinkKey"), "0")
    return message
