// crdcheck judges a CRD and objects of it with Kubernetes' own code, as a kube-apiserver would,
// without running one (k8s.io/apiextensions-apiserver v0.34, Kubernetes 1.34).
//
//	crdcheck CRD.yaml < objects.jsonl
//
// First the CRD, as on its creation: a structural schema, valid defaults, CEL rules that compile
// within the cost budget. Its errors go to stderr, one a line, and make the exit status 1. Then
// each object of stdin (one JSON object a line), as on a create with strict field validation
// (kubectl's default): unknown fields, defaults, the schema, list sets, the CEL rules. For each
// object one line on stdout: a JSON list of the errors, empty when the object is accepted.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	structurallisttype "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

func main() {
	if len(os.Args) != 2 {
		fail(fmt.Errorf("usage: crdcheck CRD.yaml < objects.jsonl"))
	}
	data, err := os.ReadFile(os.Args[1])
	fail(err)
	var v1crd apiextensionsv1.CustomResourceDefinition
	fail(yaml.UnmarshalStrict(data, &v1crd))
	apiextensionsv1.SetObjectDefaults_CustomResourceDefinition(&v1crd)
	var crd apiextensions.CustomResourceDefinition
	fail(apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(&v1crd, &crd, nil))
	crdErrors := validation.ValidateCustomResourceDefinition(context.TODO(), &crd)
	for _, e := range crdErrors {
		fmt.Fprintln(os.Stderr, e.Error())
	}
	if len(crdErrors) > 0 {
		os.Exit(1)
	}

	// One served version: the internal form keeps its schema at the top.
	schema := crd.Spec.Validation.OpenAPIV3Schema
	if crd.Spec.Versions[0].Schema != nil {
		schema = crd.Spec.Versions[0].Schema.OpenAPIV3Schema
	}
	structural, err := structuralschema.NewStructural(schema)
	fail(err)
	schemaValidator, _, err := apiservervalidation.NewSchemaValidator(schema)
	fail(err)
	celValidator := cel.NewValidator(structural, true, celconfig.PerCallLimit)

	lines := bufio.NewScanner(os.Stdin)
	lines.Buffer(make([]byte, 1<<20), 1<<24)
	for lines.Scan() {
		var obj map[string]interface{}
		fail(utiljson.Unmarshal(lines.Bytes(), &obj)) // integers as int64, as the API server reads them
		found := []string{}
		unknown := structuralpruning.PruneWithOptions(obj, structural, true,
			structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
		for _, path := range unknown {
			found = append(found, fmt.Sprintf("unknown field %q", path))
		}
		structuraldefaulting.Default(obj, structural)
		errs := apiservervalidation.ValidateCustomResource(nil, obj, schemaValidator)
		errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, structural, obj)...)
		if len(errs) == 0 { // the API server runs the rules only on an object the schema accepts
			var celErrs field.ErrorList
			celErrs, _ = celValidator.Validate(context.TODO(), nil, structural, obj, nil, celconfig.RuntimeCELCostBudget)
			errs = append(errs, celErrs...)
		}
		for _, e := range errs {
			found = append(found, e.Error())
		}
		line, err := json.Marshal(found)
		fail(err)
		fmt.Println(string(line))
	}
	fail(lines.Err())
}

func fail(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "crdcheck:", err)
		os.Exit(2)
	}
}
