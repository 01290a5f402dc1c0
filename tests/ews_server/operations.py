"""The EWS operations the test server answers (all but GetStreamingEvents, see ``server.py``).

Each operation takes the parsed request element (``<m:GetItem>`` ...) and the authenticated
mailbox address and returns the ``<m:{Operation}Response>`` element. Per-item failures become
``ResponseClass="Error"`` messages (``ResponseError``); malformed requests become SOAP faults.

What exchangelib 5.6 sends for the calls a mail source makes (``Exchange2016`` dialect)::

    <m:GetFolder><m:FolderShape><t:BaseShape>IdOnly</t:BaseShape>...</m:FolderShape>
      <m:FolderIds><t:DistinguishedFolderId Id="inbox"><t:Mailbox>
        <t:EmailAddress>u@example.com</t:EmailAddress>...</t:Mailbox></t:DistinguishedFolderId>
      </m:FolderIds></m:GetFolder>
    <m:Subscribe><m:StreamingSubscriptionRequest><t:FolderIds><t:FolderId Id=".." ChangeKey=".."/>
      </t:FolderIds><t:EventTypes><t:EventType>NewMailEvent</t:EventType>...</t:EventTypes>
      </m:StreamingSubscriptionRequest></m:Subscribe>
    <m:GetItem><m:ItemShape><t:BaseShape>IdOnly</t:BaseShape><t:AdditionalProperties>
      <t:FieldURI FieldURI="item:MimeContent"/>...</t:AdditionalProperties></m:ItemShape>
      <m:ItemIds><t:ItemId Id=".." ChangeKey=".."/></m:ItemIds></m:GetItem>
    <m:FindItem Traversal="Shallow"><m:ItemShape>...</m:ItemShape>
      <m:IndexedPageItemView MaxEntriesReturned="100" Offset="0" BasePoint="Beginning"/>
      <m:Restriction><t:IsGreaterThanOrEqualTo><t:FieldURI FieldURI="item:DateTimeReceived"/>
        <t:FieldURIOrConstant><t:Constant Value="2026-11-29T16:00:00Z"/></t:FieldURIOrConstant>
      </t:IsGreaterThanOrEqualTo></m:Restriction>
      <m:SortOrder>...</m:SortOrder><m:ParentFolderIds>...</m:ParentFolderIds></m:FindItem>
    <m:Unsubscribe><m:SubscriptionId>..</m:SubscriptionId></m:Unsubscribe>
"""

from __future__ import annotations

import base64
import binascii
import email
import email.policy
import xml.etree.ElementTree as ET
from collections.abc import Callable

from .mailbox import ExchangeStore, Folder, Item, Mailbox
from .restriction import FIELD_VALUES, evaluate, sort_items
from .soap import (
    ResponseError,
    SoapFault,
    child,
    error_message,
    ews_datetime,
    m,
    operation_response,
    success_message,
    t,
)

Operation = Callable[[ExchangeStore, str, ET.Element], ET.Element]

_ALL_PROPERTIES = frozenset(FIELD_VALUES) | {"item:ParentFolderId", "item:ItemClass"}
_DEFAULT_PROPERTIES = frozenset(
    {
        "item:Subject",
        "item:HasAttachments",
        "message:From",
        "message:ToRecipients",
        "message:IsRead",
    }
)
#: ``PidTagFlagStatus`` (Outlook's follow-up flag), asked for as an ExtendedFieldURI.
FLAG_STATUS = "extended:0x1090"

_ALL_EVENT_TYPES = frozenset(
    {
        "CopiedEvent",
        "CreatedEvent",
        "DeletedEvent",
        "ModifiedEvent",
        "MovedEvent",
        "NewMailEvent",
        "FreeBusyChangedEvent",
    }
)


# -- folders ---------------------------------------------------------------------------------


def resolve_folder(store: ExchangeStore, address: str, ref: ET.Element) -> tuple[Mailbox, Folder]:
    """A ``t:DistinguishedFolderId`` (optionally naming a mailbox) or a ``t:FolderId``."""
    if ref.tag == t("DistinguishedFolderId"):
        target = ref.findtext(f"{t('Mailbox')}/{t('EmailAddress')}") or address
        if target.lower() != address:
            raise ResponseError(
                "ErrorAccessDenied", "Access is denied. Check credentials and try again."
            )
        folder = store.mailbox(address).distinguished_folder(ref.get("Id", ""))
        if folder is None:
            raise ResponseError("ErrorFolderNotFound", "The specified folder could not be found.")
        return store.mailbox(address), folder
    if ref.tag == t("FolderId"):
        mailbox = store.mailbox(address)
        found = mailbox.folders.get(ref.get("Id", ""))
        if found is None:
            raise ResponseError("ErrorFolderNotFound", "The specified folder could not be found.")
        return mailbox, found
    raise SoapFault("ErrorSchemaValidation", f"Unexpected folder reference {ref.tag}")


def _folder_element(mailbox: Mailbox, folder: Folder, properties: set[str]) -> ET.Element:
    elem = ET.Element(t("Folder"))
    child(elem, t("FolderId"), Id=folder.folder_id, ChangeKey=folder.change_key)
    if folder.parent_id is not None:
        parent = mailbox.folders[folder.parent_id]
        child(elem, t("ParentFolderId"), Id=parent.folder_id, ChangeKey=parent.change_key)
    if folder.folder_class is not None:
        child(elem, t("FolderClass"), folder.folder_class)
    child(elem, t("DisplayName"), folder.display_name)
    total = sum(1 for i in mailbox.items.values() if i.folder_id == folder.folder_id)
    child(elem, t("TotalCount"), str(total))
    children = sum(1 for f in mailbox.folders.values() if f.parent_id == folder.folder_id)
    child(elem, t("ChildFolderCount"), str(children))
    rights = child(elem, t("EffectiveRights"))
    for right in ("CreateAssociated", "CreateContents", "CreateHierarchy", "Delete", "Modify"):
        child(rights, t(right), "true")
    child(rights, t("Read"), "true")
    child(rights, t("ViewPrivateItems"), "true")
    if folder.distinguished and "folder:DistinguishedFolderId" in properties:
        child(elem, t("DistinguishedFolderId"), folder.distinguished)
    child(elem, t("UnreadCount"), str(mailbox.unread_count(folder.folder_id)))
    return elem


def get_folder(store: ExchangeStore, address: str, request: ET.Element) -> ET.Element:
    properties = _requested_properties(request.find(m("FolderShape")))
    messages = []
    for ref in _required(request, m("FolderIds")):
        try:
            mailbox, folder = resolve_folder(store, address, ref)
        except ResponseError as e:
            messages.append(error_message("GetFolder", e.code, e.text))
            continue
        message = success_message("GetFolder")
        child(message, m("Folders")).append(_folder_element(mailbox, folder, properties))
        messages.append(message)
    return operation_response("GetFolder", messages)


# -- items -----------------------------------------------------------------------------------


def _requested_properties(shape: ET.Element | None) -> set[str]:
    if shape is None:
        raise SoapFault("ErrorSchemaValidation", "The request failed schema validation: no shape.")
    base = shape.findtext(t("BaseShape"), "IdOnly")
    properties: set[str] = set()
    if base == "AllProperties":
        properties |= _ALL_PROPERTIES
    elif base == "Default":
        properties |= _DEFAULT_PROPERTIES
    for uri in shape.iter(t("FieldURI")):
        properties.add(uri.get("FieldURI", ""))
    for extended in shape.iter(t("ExtendedFieldURI")):
        # The one MAPI property served: PidTagFlagStatus, as a hex or a decimal tag.
        tag = extended.get("PropertyTag", "")
        if tag.lower() in ("0x1090", "4240"):
            properties.add(FLAG_STATUS)
    if shape.findtext(t("IncludeMimeContent"), "false") == "true":
        properties.add("item:MimeContent")
    return properties


def _mailbox_element(parent: ET.Element, tag: str, name: str, address: str) -> None:
    mailbox = child(child(parent, tag), t("Mailbox"))
    if name:
        child(mailbox, t("Name"), name)
    child(mailbox, t("EmailAddress"), address)
    child(mailbox, t("RoutingType"), "SMTP")
    child(mailbox, t("MailboxType"), "OneOff")


def item_element(mailbox: Mailbox, item: Item, properties: set[str]) -> ET.Element:
    """A ``t:Message`` carrying the requested properties in ``types.xsd`` sequence order."""
    header = email.message_from_bytes(item.mime, policy=email.policy.compat32)
    elem = ET.Element(t("Message"))
    if "item:MimeContent" in properties:
        mime = base64.b64encode(item.mime).decode()
        child(elem, t("MimeContent"), mime, CharacterSet="UTF-8")
    child(elem, t("ItemId"), Id=item.item_id, ChangeKey=item.change_key)
    if "item:ParentFolderId" in properties:
        folder = mailbox.folders[item.folder_id]
        child(elem, t("ParentFolderId"), Id=folder.folder_id, ChangeKey=folder.change_key)
    if "item:ItemClass" in properties:
        child(elem, t("ItemClass"), "IPM.Note")
    if "item:Subject" in properties and item.subject is not None:
        child(elem, t("Subject"), item.subject)
    if "item:DateTimeReceived" in properties:
        child(elem, t("DateTimeReceived"), ews_datetime(item.received))
    if "item:Size" in properties:
        child(elem, t("Size"), str(item.size))
    if "item:Categories" in properties and item.categories:
        categories = child(elem, t("Categories"))
        for category in item.categories:
            child(categories, t("String"), category)
    if "item:InReplyTo" in properties and header.get("In-Reply-To"):
        child(elem, t("InReplyTo"), header["In-Reply-To"].strip())
    if "item:DateTimeSent" in properties and item.sent is not None:
        child(elem, t("DateTimeSent"), ews_datetime(item.sent))
    if "item:DateTimeCreated" in properties:
        child(elem, t("DateTimeCreated"), ews_datetime(item.received))
    if "item:HasAttachments" in properties:
        child(elem, t("HasAttachments"), "true" if header.is_multipart() else "false")
    if FLAG_STATUS in properties and item.flag_status:
        extended = child(elem, t("ExtendedProperty"))
        child(extended, t("ExtendedFieldURI"), PropertyTag="0x1090", PropertyType="Integer")
        child(extended, t("Value"), str(item.flag_status))
    if "message:Sender" in properties and item.sender is not None:
        _mailbox_element(elem, t("Sender"), *item.sender)
    if "message:ToRecipients" in properties and item.to:
        recipients = child(elem, t("ToRecipients"))
        for name, address in item.to:
            mailbox_elem = child(recipients, t("Mailbox"))
            if name:
                child(mailbox_elem, t("Name"), name)
            child(mailbox_elem, t("EmailAddress"), address)
            child(mailbox_elem, t("RoutingType"), "SMTP")
    if "message:From" in properties and item.sender is not None:
        _mailbox_element(elem, t("From"), *item.sender)
    if "message:InternetMessageId" in properties and item.internet_message_id:
        child(elem, t("InternetMessageId"), item.internet_message_id)
    if "message:IsRead" in properties:
        child(elem, t("IsRead"), "true" if item.is_read else "false")
    if "message:References" in properties and header.get("References"):
        child(elem, t("References"), " ".join(header["References"].split()))
    return elem


def _lookup_item(mailbox: Mailbox, item_id: str) -> Item:
    try:
        raw = base64.b64decode(item_id, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if not raw.startswith(b"I\x00"):
        raise ResponseError("ErrorInvalidIdMalformed", "Id is malformed.")
    item = mailbox.items.get(item_id)
    if item is None:
        raise ResponseError("ErrorItemNotFound", "The specified object was not found in the store.")
    return item


def get_item(store: ExchangeStore, address: str, request: ET.Element) -> ET.Element:
    properties = _requested_properties(request.find(m("ItemShape")))
    mailbox = store.mailbox(address)
    messages = []
    for ref in _required(request, m("ItemIds")):
        try:
            item = _lookup_item(mailbox, ref.get("Id", ""))
        except ResponseError as e:
            messages.append(error_message("GetItem", e.code, e.text))
            continue
        message = success_message("GetItem")
        child(message, m("Items")).append(item_element(mailbox, item, properties))
        messages.append(message)
    return operation_response("GetItem", messages)


def find_item(store: ExchangeStore, address: str, request: ET.Element) -> ET.Element:
    if request.get("Traversal", "Shallow") != "Shallow":
        raise SoapFault("ErrorInvalidRequest", "Only Shallow traversal is supported here.")
    properties = _requested_properties(request.find(m("ItemShape")))
    if "item:MimeContent" in properties:
        raise SoapFault("ErrorInvalidPropertyRequest", "MimeContent is not valid for FindItem.")
    restriction = request.find(m("Restriction"))
    order = request.find(m("SortOrder"))
    view = request.find(m("IndexedPageItemView"))
    offset = int(view.get("Offset", "0")) if view is not None else 0
    limit = int(view.get("MaxEntriesReturned", "1000")) if view is not None else 1000
    messages = []
    for ref in _required(request, m("ParentFolderIds")):
        try:
            mailbox, folder = resolve_folder(store, address, ref)
            matched = [
                i
                for i in mailbox.items.values()
                if i.folder_id == folder.folder_id
                and (restriction is None or evaluate(restriction[0], i))
            ]
        except ResponseError as e:
            messages.append(error_message("FindItem", e.code, e.text))
            continue
        sort_items(matched, order)
        page = matched[offset : offset + limit]
        message = success_message("FindItem")
        root = child(
            message,
            m("RootFolder"),
            IndexedPagingOffset=str(offset + len(page)),
            TotalItemsInView=str(len(matched)),
            IncludesLastItemInRange="true" if offset + len(page) >= len(matched) else "false",
        )
        items = child(root, t("Items"))
        items.extend(item_element(mailbox, i, properties) for i in page)
        messages.append(message)
    return operation_response("FindItem", messages)


# -- subscriptions ---------------------------------------------------------------------------


def subscribe(store: ExchangeStore, address: str, request: ET.Element) -> ET.Element:
    streaming = request.find(m("StreamingSubscriptionRequest"))
    if streaming is None:
        message = error_message(
            "Subscribe",
            "ErrorInvalidSubscriptionRequest",
            "Only streaming subscriptions are implemented by this test server.",
        )
        return operation_response("Subscribe", [message])
    event_types = {e.text or "" for e in streaming.iter(t("EventType"))}
    if not event_types or not event_types <= _ALL_EVENT_TYPES:
        raise SoapFault("ErrorSchemaValidation", f"Invalid event types {sorted(event_types)}")
    folder_ids: set[str] | None = None
    if streaming.get("SubscribeToAllFolders", "false") != "true":
        try:
            folder_ids = {
                resolve_folder(store, address, ref)[1].folder_id
                for ref in _required(streaming, t("FolderIds"))
            }
        except ResponseError as e:
            return operation_response("Subscribe", [error_message("Subscribe", e.code, e.text)])
    sub_id = store.subscribe(address, folder_ids, event_types)
    message = success_message("Subscribe")
    child(message, m("SubscriptionId"), sub_id)
    return operation_response("Subscribe", [message])


def unsubscribe(store: ExchangeStore, address: str, request: ET.Element) -> ET.Element:
    sub_id = request.findtext(m("SubscriptionId"), "")
    with store.cond:
        sub = store.live_subscription(sub_id)
        if sub is None or sub.address != address:
            message = error_message(
                "Unsubscribe",
                "ErrorSubscriptionNotFound",
                "The specified subscription was not found.",
            )
        else:
            store.kill_subscription(sub_id)
            message = success_message("Unsubscribe")
    return operation_response("Unsubscribe", [message])


def convert_id(store: ExchangeStore, address: str, request: ET.Element) -> ET.Element:
    """Only what exchangelib's version guessing needs: its ``DUMMY`` id is malformed.

    exchangelib (``Version.guess``) sends ``<t:AlternateId Format="EwsId" Id="DUMMY"
    Mailbox="DUMMY"/>`` and reads the build from the ``ServerVersionInfo`` header of the answer.
    """
    messages = [
        error_message("ConvertId", "ErrorInvalidIdMalformed", "Id is malformed.")
        for _ in _required(request, m("SourceIds"))
    ]
    return operation_response("ConvertId", messages)


def _required(parent: ET.Element, tag: str) -> ET.Element:
    elem = parent.find(tag)
    if elem is None or len(elem) == 0:
        local = tag.rsplit("}", 1)[-1]
        raise SoapFault("ErrorSchemaValidation", f"The request failed schema validation: {local}.")
    return elem


OPERATIONS: dict[str, Operation] = {
    "GetFolder": get_folder,
    "GetItem": get_item,
    "FindItem": find_item,
    "Subscribe": subscribe,
    "ConvertId": convert_id,
    "Unsubscribe": unsubscribe,
}
