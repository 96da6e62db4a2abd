"""The handlers of the query service, one module per area; `services.query.routes` tables them.

Views get their path ids, query and body validated (`services.query.routes.Route.call`), call the
domain code (`services.query.recall`, `insights`, `shared`), and shape the response. They read app state through `services.query.appkeys` only, and
import neither the route table nor the app: the import graph runs app → routes → views → domain.
"""
