// /docs: Swagger UI (shipped by the swagger-ui-bundle package) over /openapi.json.
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
});
