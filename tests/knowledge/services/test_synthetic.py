from knowledge.services.evaluation.synthetic import synthetic_corpus


def test_it_makes_the_same_corpus_from_the_same_seed():
    assert synthetic_corpus(seed=3) == synthetic_corpus(seed=3)
    assert synthetic_corpus(seed=3).documents != synthetic_corpus(seed=4).documents


def test_it_puts_every_supporting_sentence_in_the_document_it_names():
    corpus = synthetic_corpus(seed=5, people=12, companies=4)
    texts = {document.title: document.text for document in corpus.documents}

    for question in corpus.questions:
        assert len(question.supporting_sentences) == len(question.supporting_documents)
        for sentence, title in zip(question.supporting_sentences, question.supporting_documents, strict=True):
            assert sentence in texts[title]


def test_it_asks_single_fact_and_two_hop_questions_whose_answer_is_a_known_entity():
    corpus = synthetic_corpus(seed=5, people=12, companies=4)

    kinds = {question.kind for question in corpus.questions}
    assert kinds == {"single", "two_hop"}
    for question in corpus.questions:
        assert question.answer in question.entities
        assert set(question.entities) <= set(corpus.entities)
        assert all(entity in " ".join(question.supporting_sentences) for entity in question.entities)
    two_hop = [question for question in corpus.questions if question.kind == "two_hop"]
    assert all(len(set(question.supporting_documents)) == 2 for question in two_hop)
    # A two-hop question names only the start of the chain; the bridge entity must be found.
    assert all(question.entities[1] not in question.text for question in two_hop)


def test_it_gives_each_person_a_unique_first_and_last_name():
    corpus = synthetic_corpus(seed=11, people=30, companies=10)

    people = [name for name, kind in corpus.entities.items() if kind == "person"]
    assert len({name.split()[0] for name in people}) == len(people)
    assert len({name.split()[1] for name in people}) == len(people)
