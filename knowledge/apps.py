from django.apps import AppConfig


class KnowledgeConfig(AppConfig):
    name = "knowledge"
    verbose_name = "Knowledge graph"

    def ready(self):
        # Every process (web, workers, commands) takes its models from the Models page's picks,
        # falling back to the environment; the pipeline only knows the provider it is given.
        from knowledge.rag import llm
        from knowledge.services import model_endpoints

        llm.set_provider(model_endpoints.active_config)
