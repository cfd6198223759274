"""Saved subgraphs name a node's degree `degree`, as every other drawing of the graph does
(knowledge/rag/graph/drawing.py); answers saved before called it `rank`."""

from django.db import migrations


def rename_rank_to_degree(apps, schema_editor):
    Message = apps.get_model("chat", "Message")
    changed = []
    for message in Message.objects.filter(subgraph__nodes__0__has_key="rank").iterator(chunk_size=500):
        for node in message.subgraph.get("nodes", []):
            if "rank" in node:
                node["degree"] = node.pop("rank")
        changed.append(message)
        if len(changed) >= 500:
            Message.objects.bulk_update(changed, ["subgraph"])
            changed = []
    Message.objects.bulk_update(changed, ["subgraph"])


class Migration(migrations.Migration):
    dependencies = [("chat", "0003_chat_preferences")]

    operations = [migrations.RunPython(rename_rank_to_degree, migrations.RunPython.noop)]
