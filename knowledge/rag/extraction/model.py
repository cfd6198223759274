"""The model engine: one extraction call per chunk, then the configured gleaning passes."""

from knowledge.models import Chunk, Workspace
from knowledge.rag import llm, prompts
from knowledge.rag.extraction.records import Parsed, parse_extraction


def extract_with_model(chunks: list[Chunk], workspace: Workspace) -> list[tuple[Parsed, llm.Usage] | llm.LLMError]:
    entity_types = [*workspace.get_entity_types()]
    conversations = [prompts.extraction_messages(text=chunk.text, entity_types=entity_types) for chunk in chunks]
    usages = [llm.Usage() for _ in chunks]
    answers = llm.complete_many(conversations, kind="extract", usage_each=usages, temperature=0)
    results: list[tuple[Parsed, llm.Usage] | llm.LLMError] = []
    parsed_all: list[Parsed | None] = []
    for answer in answers:
        if isinstance(answer, llm.LLMError):
            parsed_all.append(None)
        else:
            parsed_all.append(parse_extraction(answer, entity_types=entity_types))
    for _ in range(workspace.gleaning_passes):
        alive = [index for index, answer in enumerate(answers) if not isinstance(answer, llm.LLMError)]
        if not alive:
            break
        follow_ups = [prompts.gleaning_messages(first=conversations[index], answer=answers[index]) for index in alive]
        gleaned = llm.complete_many(
            follow_ups, kind="glean", usage_each=[usages[index] for index in alive], temperature=0
        )
        for index, conversation, answer in zip(alive, follow_ups, gleaned, strict=True):
            if isinstance(answer, llm.LLMError):
                answers[index] = answer
                parsed_all[index] = None
                continue
            conversations[index] = conversation
            answers[index] = answer
            parsed_all[index].extend(parse_extraction(answer, entity_types=entity_types))
    for answer, parsed, used in zip(answers, parsed_all, usages, strict=True):
        results.append(answer if parsed is None else (parsed, used))
    return results
