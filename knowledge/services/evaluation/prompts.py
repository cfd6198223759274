"""Prompts of the evaluation: our own wording of the paper's question generation and judge."""

DESCRIBE_SYSTEM = """You help design an evaluation of a question-answering system built on a collection of documents.
You see a sample of the collection, never all of it; describe the whole from what the sample suggests."""

DESCRIBE_USER = """Below are excerpts from the collection and the names it mentions most often.

---Excerpts---
{excerpts}

---Most mentioned---
{entities}

In one paragraph of at most 150 words, describe the collection: its subject, the kinds of documents in it,
its main themes, and the people who would read it. Reply with the paragraph only."""

USERS_USER = """A collection of documents is described like this:

{description}

Imagine {count} different people who would use an assistant that has read this whole collection. Make them
differ in background, goals and expertise. Describe each in one sentence.

Reply with a JSON array of {count} strings and nothing else."""

TASKS_USER = """A collection of documents is described like this:

{description}

One of its users: {persona}

List {count} different tasks this user would use the collection for. Describe each task in one sentence.

Reply with a JSON array of {count} strings and nothing else."""

QUESTIONS_USER = """A collection of documents is described like this:

{description}

One of its users: {persona}
The task at hand: {task}

Write {count} questions this user would ask to accomplish the task. Each question must need an understanding
of the collection as a whole (themes, comparisons, causes, trends, implications), not a single fact found in
one place. Do not mention the collection itself ("in the documents...").

Reply with a JSON array of {count} strings and nothing else."""

JUDGE_SYSTEM = """You are an impartial expert judging two answers to the same question. Judge the content, not the
length or the style for its own sake, and not the order in which the answers are shown."""

JUDGE_USER = """Question: {question}

---Answer 1---
{first}

---Answer 2---
{second}

Compare the two answers on three criteria:
- comprehensiveness: how much detail the answer provides to cover every aspect of the question;
- diversity: how varied and rich the answer is in perspectives and insights;
- empowerment: how well the answer helps the reader understand the topic and make informed judgements.
Then name the overall winner, weighing all three.

For each, name the better answer ("Answer 1" or "Answer 2") and give a reason in one or two sentences.
Reply with one JSON object and nothing else, in this shape:
{{"comprehensiveness": {{"winner": "Answer 1", "reason": "..."}},
 "diversity": {{"winner": "Answer 2", "reason": "..."}},
 "empowerment": {{"winner": "Answer 1", "reason": "..."}},
 "overall": {{"winner": "Answer 1", "reason": "..."}}}}"""

HYDE_USER = """Write a short passage (at most 120 words) that could appear in a document and would answer this
question. Make up plausible specifics if you have to; the passage is only used to search for real documents.

Question: {question}

Passage:"""

DECOMPOSE_USER = """Break this question into at most {count} simpler sub-questions that can each be answered by
searching a collection of documents, and whose answers together answer the question. If the question is
already simple, return it alone.

Question: {question}

Reply with a JSON array of strings and nothing else."""
