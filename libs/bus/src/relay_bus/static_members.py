"""Removing a static member from a consumer group (KIP-345's LeaveGroup v3), for a member known
to be dead: its partitions go to the live members now, not when its session expires.

A static member (`group.instance.id`, `Consumer.member`) that is killed does not leave its
group: its partitions wait for its session timeout or for its restart under the same name.
When another process knows it is gone (nothing listens on its port any more), it removes it
through the group coordinator, as Kafka's admin `removeMembersFromConsumerGroup` does; aiokafka
has no such call, so the request is defined here (version 3, the first with member identities,
which the brokers Relay runs answer).

Invariants: the request names the member by its `group.instance.id` only (member id left
unknown), so whatever incarnation holds that name is removed; removing a live member costs a
rebalance, never a record (it rejoins, and the group's committed offsets are untouched). The
answer is whether the broker removed it (False: it was not a member, the usual case when
several processes report the same death).
"""

from __future__ import annotations

from aiokafka.errors import for_code
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Int16, Int32, Schema, String

from relay_bus import clients

_LEAVE_GROUP = 13
_UNKNOWN_MEMBER_ID = 25


class _LeaveGroupResponseV3(Response):  # type: ignore[misc]  # aiokafka has no types
    API_KEY = _LEAVE_GROUP
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        (
            "members",
            Array(
                ("member_id", String("utf-8")),
                ("group_instance_id", String("utf-8")),
                ("error_code", Int16),
            ),
        ),
    )


class _LeaveGroupRequestV3(RequestStruct):  # type: ignore[misc]
    API_KEY = _LEAVE_GROUP
    API_VERSION = 3
    RESPONSE_TYPE = _LeaveGroupResponseV3
    SCHEMA = Schema(
        ("group_id", String("utf-8")),
        ("members", Array(("member_id", String("utf-8")), ("group_instance_id", String("utf-8")))),
    )


class _LeaveGroup(Request[_LeaveGroupRequestV3]):  # type: ignore[misc]
    API_KEY = _LEAVE_GROUP

    def __init__(self, group_id: str, instance_id: str) -> None:
        self.group_id = group_id
        self.instance_id = instance_id

    def build(self, request_struct_class: type[_LeaveGroupRequestV3]) -> _LeaveGroupRequestV3:
        return request_struct_class(self.group_id, [("", self.instance_id)])


async def remove(admin: clients.AIOKafkaAdminClient, group_id: str, instance_id: str) -> bool:
    """Remove the static member `instance_id` from `group_id` (a physical group name); True if
    it was a member. Kafka errors are raised (`KafkaError`)."""
    node = await admin.find_coordinator(group_id)
    # aiokafka's admin client sends any request to a node; only this one is not among its calls.
    answer = await admin._send_request_to_node(node, _LeaveGroup(group_id, instance_id))
    if answer.error_code:
        raise for_code(answer.error_code)(f"LeaveGroup {group_id}")
    code = answer.members[0][2] if answer.members else _UNKNOWN_MEMBER_ID
    if code == _UNKNOWN_MEMBER_ID:
        return False
    if code:
        raise for_code(code)(f"LeaveGroup {group_id} {instance_id}")
    return True
