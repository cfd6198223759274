from knowledge.models import DEFAULT_ENTITY_TYPES
from knowledge.rag.extraction.rules import nlp_extract


def _types(text: str, entity_types=DEFAULT_ENTITY_TYPES) -> dict[str, str]:
    (records,) = nlp_extract([text], entity_types=entity_types)
    return {entity["name"]: entity["type"] for entity in records["entities"]}


def test_it_does_not_type_a_class_of_the_documentation_a_person():
    # From the Python 3.11 enum HOWTO, where spaCy calls Enum a person.
    types = _types(
        "Restricted Enum subclassing A new Enum class must have one base enum class, up to one concrete "
        "data type, and as many object-based mixin classes as needed. The first argument of the call to "
        "Enum is the name of the enumeration."
    )

    assert types["Enum"] not in ("person", "location", "organization")


def test_it_types_code_looking_names_technology():
    types = _types(
        "Microsoft released GraphRAG in 2024, and LightRAG followed it from Hong Kong. "
        "FileHandler instances send messages to disk files, and logging.getLogger() returns a logger."
    )

    assert types["GraphRAG"] == "technology"
    assert types["FileHandler"] == "technology"
    assert types["Hong Kong"] == "location"


def test_it_types_a_film_a_work_and_its_director_a_person():
    types = _types(
        "Blood Street is a 2005 American film directed by John Smith. "
        'It was on the album "311", also known as "The Blue Album".'
    )

    assert types["Blood Street"] == "work"
    assert types["John Smith"] == "person"
    assert types["Blue Album"] == "work"


def test_it_types_a_surname_a_person_and_a_company_by_its_last_word():
    types = _types(
        "Richard Morrison is an English singer. Morrison previously fronted the hard rock act Circus Diablo. "
        "The film was produced under the banner of Akhil Krishna Films."
    )

    assert types["Morrison"] == "person"
    assert types["Akhil Krishna Films"] == "organization"


def test_a_work_is_a_concept_in_a_workspace_without_works():
    types = _types(
        "Blood Street is a 2005 American film directed by John Smith.",
        entity_types=["person", "organization", "location", "concept"],
    )

    assert types["Blood Street"] == "concept"
