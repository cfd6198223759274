"""The workspace events socket: keeps an open document list current while the worker ingests.

The ingestion pipeline publishes `document.progress` to the workspace's group; each event
becomes an htmx out-of-band swap of that document's row, which htmx-ext-ws applies.

Membership is checked when the socket opens and again whenever it changes: the membership
services publish `membership.changed`, and the socket of a removed member closes with 4403
before another event reaches it, while a demoted member's rows lose their write actions at once.
Events themselves are rendered without a query, so a busy ingestion costs no query per open page.
"""

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.http import Http404
from django.template.loader import render_to_string

from knowledge import metrics
from knowledge.models import ROLE_RANK, Role
from knowledge.selectors import workspace_for_user
from knowledge.services.events import workspace_group

CLOSE_NOT_LOGGED_IN = 4401
CLOSE_NOT_A_MEMBER = 4403


class WorkspaceEventsConsumer(AsyncWebsocketConsumer):
    group = None

    async def connect(self):
        metrics.count(metrics.WEBSOCKET_CONNECTIONS, socket="events")
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.refuse(CLOSE_NOT_LOGGED_IN)
            return
        try:
            self.workspace = await database_sync_to_async(workspace_for_user)(
                user, self.scope["url_route"]["kwargs"]["slug"]
            )
        except Http404:
            await self.refuse(CLOSE_NOT_A_MEMBER)
            return
        self.user = user
        self.group = workspace_group(self.workspace.pk)
        # Joined before accepting, so no event published after the page sees "open" is missed.
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def refuse(self, code: int):
        # Accept before closing: a refused handshake reaches the browser as a bare 1006,
        # while a close frame carries the code.
        await self.accept()
        await self.close(code=code)

    async def disconnect(self, code):
        metrics.count(metrics.WEBSOCKET_DISCONNECTIONS, socket="events")
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None):
        """The socket only listens; htmx-ext-ws sends nothing unless a form asks it to."""

    async def document_progress(self, event):
        if self.workspace is None:
            return
        # Rendered from the event alone: no query per event per open page.
        html = render_to_string(
            "knowledge/_document_row.html",
            {
                "doc": event["document"],
                "workspace": self.workspace,
                "can_edit": ROLE_RANK[self.workspace.role] >= ROLE_RANK[Role.EDITOR],
                "is_owner": self.workspace.role == Role.OWNER,
                "oob": True,
            },
        )
        await self.send(text_data=html)

    async def document_deleted(self, event):
        if self.workspace is None:
            return
        await self.send(text_data=f'<tr id="document-{int(event["document"]["id"])}" hx-swap-oob="delete"></tr>')

    async def membership_changed(self, event):
        if self.workspace is None or event["user"] not in (None, self.user.pk):
            return
        try:
            self.workspace = await database_sync_to_async(workspace_for_user)(self.user, self.workspace.slug)
        except Http404:
            # Events already queued for this socket must not reach a former member either.
            self.workspace = None
            await self.close(code=CLOSE_NOT_A_MEMBER)
